"""Pickling of calls and results with their tensors taken out (as torch rpc does).

A message is a pickle plus a list of storages: every strided tensor in the object is pickled
as (storage index, dtype, size, stride, offset) and its storage's bytes travel as one tpd
tensor, once per storage however many views share it; sparse COO tensors travel as their
indices and values. On receipt each storage is one tensor over the received bytes (a view of
the receive heap, or a copy when views would starve it: tpd_event_tensor_dlpack), and views
are rebuilt on it, so what arrives shares storage the way what was sent did.
"""

import io
import pickle
import threading

import torch
import torch.utils.dlpack

from tpd import _client

_DTYPES = {
    torch.float32: 1, torch.float64: 2, torch.float16: 3, torch.bfloat16: 4, torch.int8: 5,
    torch.uint8: 6, torch.int16: 7, torch.int32: 8, torch.int64: 9, torch.bool: 10,
    torch.complex64: 11, torch.complex128: 12,
}

_received = threading.local()  # the storages of the message being unpickled

# Objects whose pickle depends on the worker the message goes to: type -> reduce(obj, that
# worker's name). rref.py registers RRef (its owner counts the RRef the receiver will build).
by_receiver = {}


def _storage(tensor):
    if hasattr(tensor, "untyped_storage"):
        storage = tensor.untyped_storage()
    else:  # torch < 2.0
        storage = tensor.storage()
    return storage.data_ptr(), storage.nbytes()


def _rebuild_tensor(index, dtype, size, stride, offset, requires_grad):
    storages = getattr(_received, "storages", None) or ()
    if index >= len(storages):
        raise ValueError(f"the message names tensor {index} of the {len(storages)} it carries")
    base = storages[index]
    if dtype != torch.uint8:
        base = base.view(dtype)
    tensor = torch.as_strided(base, size, stride, offset)
    if requires_grad:
        tensor.requires_grad_(True)
    return tensor


class _Pickler(pickle.Pickler):
    def __init__(self, buffer):
        super().__init__(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        self.buffer = buffer
        self.reset()

    def reset(self):
        self.storages = {}    # (device, data_ptr) -> index
        self.descriptors = []  # _client.storage_descriptor per storage
        self.keep = []         # what keeps each storage's memory alive until sent
        self.receiver = None   # dumps' receiver

    def reducer_override(self, obj):
        if not isinstance(obj, torch.Tensor):
            reduce = by_receiver.get(type(obj))
            if reduce is None:
                return NotImplemented
            if callable(self.receiver):
                self.receiver = self.receiver()
            return reduce(obj, self.receiver)
        if obj.is_sparse:
            return torch.sparse_coo_tensor, (obj._indices(), obj._values(), obj.size())
        if obj.layout != torch.strided:
            raise TypeError(f"tensors of layout {obj.layout} cannot be sent over RPC")
        if obj.dtype not in _DTYPES:
            raise TypeError(f"tensors of dtype {obj.dtype} cannot be sent over RPC")
        return _rebuild_tensor, (self._storage_index(obj), obj.dtype, tuple(obj.size()),
                                 tuple(obj.stride()), obj.storage_offset(), obj.requires_grad)

    def _storage_index(self, tensor):
        data_ptr, nbytes = _storage(tensor)
        key = (str(tensor.device), data_ptr)
        index = self.storages.get(key)
        if index is not None:
            return index
        index = len(self.descriptors)
        self.storages[key] = index
        if tensor.is_cuda:
            # The daemon copies after the work queued on the caller's current stream.
            descriptor = _client.storage_descriptor(
                data_ptr, nbytes, tensor.device.index,
                torch.cuda.current_stream(tensor.device).cuda_stream)
        else:
            descriptor = _client.storage_descriptor(data_ptr, nbytes)
        self.descriptors.append(descriptor)
        self.keep.append(tensor)
        return index


# Each thread's pickler, kept between messages: making one (and its buffer) costs more than
# pickling a small call. Dropped after a large message, so its buffer does not stay large.
_picklers = threading.local()
_KEEP_PICKLER_BELOW = 64 << 10


def dumps(obj, receiver=None):
    """(payload, tensor descriptors, keep-alive list) of ``obj``, a message to the worker named
    ``receiver``, or named by what ``receiver()`` returns: asked only when the message holds
    an object of ``by_receiver`` (a reply's receiver costs a call into the library)."""
    pickler = getattr(_picklers, "pickler", None)
    if pickler is None:
        pickler = _Pickler(io.BytesIO())
    _picklers.pickler = None  # a dumps within this one (a reducer's) makes its own
    pickler.receiver = receiver
    try:
        pickler.dump(obj)
        payload = pickler.buffer.getvalue()
        descriptors, keep = pickler.descriptors, pickler.keep
    finally:
        pickler.buffer.seek(0)
        pickler.buffer.truncate()
        pickler.clear_memo()
        pickler.reset()
    if len(payload) < _KEEP_PICKLER_BELOW:
        _picklers.pickler = pickler
    return payload, descriptors, keep


def loads(payload, num_tensors, event, copy=-1):
    """The object a received message carries (``Event.read``'s payload and tensor count), its
    tensors rebuilt over the storages taken out of ``event``."""
    if num_tensors == 0:
        return pickle.loads(payload)
    storages = [torch.utils.dlpack.from_dlpack(event.dlpack(i, copy)) for i in range(num_tensors)]
    previous = getattr(_received, "storages", None)
    _received.storages = storages
    try:
        return pickle.loads(payload)
    finally:
        _received.storages = previous
