"""The agent of this process while tpd.rpc is initialized: set by init_rpc, cleared by shutdown.
Kept apart so that api, rref and the agent share it without importing each other in circles."""

import threading

lock = threading.Lock()
current = None  # the Agent, while initialized


def require_initialized():
    agent = current
    if agent is None:
        raise RuntimeError(
            "RPC has not been initialized. Call torch.distributed.rpc.init_rpc first.")
    return agent
