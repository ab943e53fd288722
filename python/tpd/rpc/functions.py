"""torch.distributed.rpc.functions on tpd: ``async_execution``.

A function so decorated returns a ``torch.futures.Future``; the callee answers the call when
that future completes (tpd's deferred reply), not when the function returns, and its worker
thread is free meanwhile.
"""

import functools
from typing import Any, Callable


def async_execution(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Marks ``fn`` as returning a ``torch.futures.Future`` whose value answers the call:
    torch's ``@rpc.functions.async_execution``. The callee's worker thread is free as soon as
    ``fn`` returns; the reply goes when the future completes (with its error, if it fails).

    Args:
        fn (Callable): a function returning a ``torch.futures.Future``.

    Returns:
        ``fn`` wrapped, callable locally as before.
    """
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    # The attribute torch's agent looks for; tpd's agent looks for the same one.
    wrapper._wrapped_async_rpc_function = fn
    return wrapper
