"""CPU tensors built in this worker's shared arena: sent with no copy (tpd's own; torch has
none of these).

A CPU tensor passed to ``rpc_sync``, ``rpc_async`` or ``remote`` (or returned by a remote
function) is copied once into the session's arena before the call goes; a tensor made by
``empty`` or ``shared_like`` already lies there and is sent where it lies. The daemon reads it
after the call returns, and a receiving C++ process of the same user may read it in place for
as long as it keeps the message: write into it once ``in_flight`` is False (for ``rpc_sync``
to Python workers, once the call returned). See docs/python.md, "Tensors built in the arena".
"""

import math
from typing import Optional, Union

import torch
import torch.utils.dlpack

from tpd.rpc import _pickler, _state


def empty(*size: Union[int, tuple], dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """An uninitialized CPU tensor of ``size`` in this worker's shared arena, like
    ``torch.empty`` (contiguous), freed when its storage goes.

    Args:
        size (int...): its shape, as ints or one tuple.
        dtype (torch.dtype, optional): its dtype (None: ``torch.get_default_dtype()``).

    Raises:
        RuntimeError: RPC not initialized, or the arena cannot hold it (its message names the
            arena's size: ``[data] arena_bytes``).
    """
    agent = _state.require_initialized()
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    dtype = dtype or torch.get_default_dtype()
    nbytes = math.prod(size) * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.empty(size, dtype=dtype)
    block = torch.utils.dlpack.from_dlpack(agent.client.arena_dlpack(nbytes))
    return block.view(dtype).view(size)


def shared_like(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of the CPU tensor ``tensor`` in this worker's shared arena (contiguous, same
    shape, dtype and values): sent with no copy however often it is sent.

    Args:
        tensor (torch.Tensor): what to copy (a CPU tensor).

    Raises:
        TypeError: ``tensor`` is not on the CPU.
        RuntimeError: RPC not initialized, or the arena cannot hold it.
    """
    if tensor.device.type != "cpu":
        raise TypeError(f"shared_like takes a CPU tensor, not one on {tensor.device}")
    out = empty(tuple(tensor.shape), dtype=tensor.dtype)
    out.copy_(tensor)
    return out


def in_flight(tensor: torch.Tensor) -> bool:
    """Whether a sent message still holds the arena block of ``tensor`` (made by ``empty`` or
    ``shared_like``): the daemon or a receiver may still read it, so writes would reach them.

    Args:
        tensor (torch.Tensor): a tensor made by ``empty`` or ``shared_like`` (or a view of one).

    Raises:
        RuntimeError: RPC not initialized, or ``tensor`` lies in no arena block of this
            worker's.
    """
    agent = _state.require_initialized()
    data_ptr, _ = _pickler._storage(tensor)
    return agent.client.arena_in_flight(data_ptr)
