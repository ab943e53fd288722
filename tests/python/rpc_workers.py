"""What the workers of tests/python/test_rpc.py run, in processes of their own
(rank_processes.RankProcess: they import this module by name, as torch pickles functions by
reference)."""

import os
import signal
import time
import traceback

import torch

import rank_processes


# --- functions called remotely ---

def add(a, b):
    return a + b


def raise_value_error(text):
    raise ValueError(text)


def sleep_then(seconds, value):
    time.sleep(seconds)
    return value


def views_share_storage(a, b):
    return (a.untyped_storage().data_ptr() if hasattr(a, "untyped_storage")
            else a.storage().data_ptr()) == (
        b.untyped_storage().data_ptr() if hasattr(b, "untyped_storage")
        else b.storage().data_ptr())


def identity(x):
    return x


class Counter:
    def __init__(self, start):
        self.value = start

    def increment(self, by):
        self.value += by
        return self.value


def rref_value_plus(rref, n):
    return rref.to_here() + n


def pid():
    return os.getpid()


def async_add_later(a, b):
    future = torch.futures.Future()

    def complete():
        time.sleep(0.1)
        future.set_result(a + b)
    import threading
    threading.Thread(target=complete).start()
    return future


def chained_async(to, x):
    import tpd.rpc as rpc
    return rpc.rpc_async(to, add, args=(x, 1)).then(lambda f: f.wait() * 2)


def _mark_async():
    from tpd.rpc import functions
    global async_add_later, chained_async
    async_add_later = functions.async_execution(async_add_later)
    chained_async = functions.async_execution(chained_async)


_mark_async()


# --- running workers ---

def _child(target, rank, world_size, socket, init_method, queue, kwargs):
    os.environ["TPD_SOCKET"] = socket
    worker = os.getpid()
    try:
        result = target(rank, world_size, init_method, **kwargs)
        queue.put((rank, "ok", result))
    except BaseException:
        # A process the scenario forked leaves through here too (sys.exit): not the rank's end.
        if os.getpid() == worker:
            queue.put((rank, "error", traceback.format_exc()))
        raise


def run(target, world_size, sockets, init_method, timeout=120, may_die=(), **kwargs):
    """Runs ``target(rank, world_size, init_method, **kwargs)`` in world_size processes, rank r
    on daemon sockets[r % len(sockets)]; returns {rank: result}; raises naming a rank that
    failed, with its traceback. Ranks in ``may_die`` may be killed by the scenario."""
    queue = rank_processes.queue()
    procs = [rank_processes.RankProcess(
        target=_child,
        args=(target, r, world_size, sockets[r % len(sockets)], init_method, queue, kwargs))
        for r in range(world_size)]
    for p in procs:
        p.start()
    results = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world_size - len(may_die):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"ranks {sorted(set(range(world_size)) - set(results))} "
                                     f"did not finish within {timeout} s")
            try:
                rank, outcome, value = queue.get(timeout=min(left, 1.0))
            except Exception:
                dead = [r for r, p in enumerate(procs)
                        if p.exitcode not in (None, 0) and r not in results and r not in may_die]
                if dead:
                    raise AssertionError(f"rank {dead[0]} died with exit code "
                                         f"{procs[dead[0]].exitcode}")
                continue
            if outcome == "error":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            results[rank] = value
        for r, p in enumerate(procs):
            if r in may_die:
                continue
            p.join(timeout=30)
            assert p.exitcode == 0, f"rank {r} exited with {p.exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
                p.join()
    return results


def options(init_method, **kwargs):
    import tpd.rpc as rpc
    return rpc.TensorPipeRpcBackendOptions(init_method=init_method, **kwargs)


def device_of(x):
    return str(x.device)


def total(x):
    return float(x.sum())


class _SlowBackward(torch.autograd.Function):
    """x * 2 whose backward pass takes `seconds` (a worker killed during it)."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad * 2, None


def slow_backward(x, seconds):
    return _SlowBackward.apply(x, seconds)
