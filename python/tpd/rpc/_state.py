"""The agent of this process while tpd.rpc is initialized: set by init_rpc, cleared by shutdown.
Kept apart so that api, rref and the agent share it without importing each other in circles."""

import ctypes
import os
import threading

lock = threading.Lock()
current = None      # the Agent, while initialized
forked_from = None  # in a forked child of an initialized process: the pid that called init_rpc


def forked_error(pid):
    # Not "call init_rpc in the child": tpd's client library cannot connect in a forked child
    # (_capi.connecting).
    return RuntimeError(
        f"RPC was initialized in process {pid}, not in this forked child (pid {os.getpid()}): "
        "use RPC in processes started with multiprocessing's 'spawn' or 'forkserver' start "
        "method")


def require_initialized():
    agent = current
    if agent is None:
        if forked_from is not None:
            raise forked_error(forked_from)
        raise RuntimeError(
            "RPC has not been initialized. Call torch.distributed.rpc.init_rpc first.")
    return agent


def _forget_in_child():
    # A forked child has only the thread that forked: the agent's threads, and its membership,
    # stay the parent's. The child forgets the agent (RPC is not initialized there), but never
    # frees it, not even at exit (hence a reference nobody drops rather than a variable,
    # which Python clears at exit): what it holds (received tensors whose memory the daemon
    # lent, the rendezvous store) would be given back by the child on the parent's behalf.
    # The lock may have been held by one of the parent's other threads at the fork.
    global lock, current, forked_from
    lock = threading.Lock()
    if current is not None:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(current))
        forked_from = current.pid
        current = None


os.register_at_fork(after_in_child=_forget_in_child)
