"""A Python handle on the node's daemon over the C ABI: the layer tpd.rpc and tpd.Store share.

With ``tpd._capi`` (the library's loading and its C types), this is the ctypes layer: no other
module of tpd imports either. Payloads are bytes; tensors go in as descriptors
(``storage_descriptor``) and come out of events as DLPack capsules (``Event.dlpack``); times
are seconds, as everywhere in tpd's Python (the ABI's microseconds stay in here).
"""

import ctypes

from tpd import _capi
# What the rest of tpd needs of the ABI's words, as plain Python values and errors.
from tpd._capi import (CALL_REVERSE_MAP, DEADLINE_EXCEEDED, EVENT_RELEASED, INVALID_ARGUMENT, OK,
                       QUEUE_REPLIES, QUEUE_REQUESTS, TpdError, b, is_mine)

__all__ = [
    "CALL_REVERSE_MAP", "DEADLINE_EXCEEDED", "EVENT_RELEASED", "INVALID_ARGUMENT", "OK",
    "QUEUE_REPLIES", "QUEUE_REQUESTS", "TpdError", "b", "is_mine",
    "Client", "Event", "StoreHandle", "forked_from", "group_reader", "library_path",
    "storage_descriptor",
]


def forked_from():
    """The pid of the process this one was forked from after it loaded the library, or None."""
    return _capi._forked_from


def library_path():
    """The path of the client library this process loaded (loading it now if it has not)."""
    return _capi.library()._name


def storage_descriptor(data_ptr, nbytes, cuda_device=None, stream=None):
    """A tensor descriptor of ``nbytes`` bytes (uint8, 1-D) at ``data_ptr``: host memory, or
    device memory of ``cuda_device`` written on ``stream`` (a cudaStream_t, None: the default
    stream). The pickle of a message says what the bytes hold."""
    descriptor = _capi.Tensor()
    descriptor.dtype = 6  # uint8
    descriptor.ndim = 1
    descriptor.shape[0] = nbytes
    descriptor.data = data_ptr or None
    descriptor.nbytes = nbytes
    if cuda_device is None:
        descriptor.device_type = _capi.CPU
    else:
        descriptor.device_type = _capi.CUDA
        descriptor.device_index = cuda_device
        descriptor.stream = stream or None
    return descriptor


def group_reader(client, group):
    """A function returning ``group``'s view (the daemon's GroupView as a dict) through
    ``client``'s handle, which keeps working once the client was detached to its new owner (the
    TPD agent, which asks only while it runs)."""
    lib, handle = client._lib, client._handle.value
    encoded = _capi.b(group)

    def read():
        out = ctypes.c_void_p()
        _capi.check(lib.tpd_get_group(handle, encoded, None, ctypes.byref(out)), lib)
        return _capi.take_json(out.value, lib)
    return read


class _Library:
    """What a handle's calls need of the library copy that made it (``self._lib``): a forked
    child loads a copy of its own (_capi.library), while handles it inherited keep their
    parent's."""

    __slots__ = ()

    def _ok(self, code):
        _capi.check(code, self._lib)

    def _json(self, ptr):
        return _capi.take_json(ptr, self._lib)

    def _string(self, ptr):
        return _capi.take_string(ptr, self._lib)

    def _bytes(self, ptr, size):
        return _capi.take_bytes(ptr, size, self._lib)


class Event(_Library):
    """A request to answer, or a finished call (``_capi.EVENT_*``); frees itself when dropped.

    A request dropped unanswered is answered INTERNAL by the library, so a lost request never
    leaves its caller waiting for a deadline. In a forked child the library leaves the parent's
    events alone (tpd_client.h, "Across fork()").
    """

    __slots__ = ("_ptr", "_lib")

    def __init__(self, ptr):
        self._lib = _capi.library()
        self._ptr = ptr

    def __del__(self):
        self.free()

    def free(self):
        ptr, self._ptr = self._ptr, None
        if ptr:
            self._lib.tpd_event_free(ptr)

    @property
    def kind(self):
        return self._lib.tpd_event_kind(self._ptr)

    @property
    def tag(self):
        return self._lib.tpd_event_tag(self._ptr)

    def status(self):
        message = ctypes.c_char_p()
        code = self._lib.tpd_event_status(self._ptr, ctypes.byref(message))
        return code, (message.value or b"").decode("utf-8", "replace")

    def read(self):
        """(code, message, payload, number of tensors) with one call into the library: what
        status(), payload() and num_tensors() return."""
        info = _capi.EventInfo()
        self._ok(self._lib.tpd_event_read(self._ptr, info))
        size = info.payload_size
        payload = ctypes.string_at(info.payload, size) if size else b""
        message = info.message.decode("utf-8", "replace") if info.code else ""
        return info.code, message, payload, info.num_tensors

    def payload(self):
        size = ctypes.c_size_t()
        ptr = self._lib.tpd_event_payload(self._ptr, ctypes.byref(size))
        return ctypes.string_at(ptr, size.value) if size.value else b""

    @property
    def method(self):
        return self._lib.tpd_event_method(self._ptr).decode("utf-8")

    @property
    def caller(self):
        return self._lib.tpd_event_caller(self._ptr).decode("utf-8")

    def num_tensors(self):
        return self._lib.tpd_event_num_tensors(self._ptr)

    def dlpack(self, i, copy=-1):
        """The i-th tensor as a "dltensor" capsule of its bytes (uint8, 1-D); ``copy`` as
        tpd_event_tensor_dlpack's: -1 lets the library keep the receive heap from starving."""
        managed = ctypes.c_void_p()
        self._ok(self._lib.tpd_event_tensor_dlpack(self._ptr, i, copy, ctypes.byref(managed)))
        return _capsule(managed.value)

    def reply(self, payload, tensors=(), release_tag=0):
        """Answers the request; with ``release_tag``, an EVENT_RELEASED with it follows on the
        replies queue once the daemon no longer reads the reply's CUDA tensors."""
        array, n = _tensor_array(tensors)
        self._ok(self._lib.tpd_reply(self._ptr, payload, len(payload), array, n,
                                     release_tag))

    def reply_error(self, code, message):
        self._ok(self._lib.tpd_reply_error(self._ptr, code, _capi.b(message)))


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def _capsule(managed):
    # The consumer (torch.utils.dlpack.from_dlpack) renames it "used_dltensor" and calls the
    # DLManagedTensor's deleter when its tensor goes.
    return _PyCapsule_New(managed, b"dltensor", None)


# tpd_join_options_set's keys whose values are microseconds there, seconds here.
_SECONDS_OPTIONS = ("timeout", "rpc_timeout")


def _tensor_array(tensors):
    n = len(tensors)
    if n == 0:
        return None, 0
    array = (_capi.Tensor * n)(*tensors)
    return array, n


class Client(_Library):
    """One connection (and, once it joins or serves, one session) to the node's daemon.

    Closing it in a forked child forgets it: the session stays the parent's (the library
    leaves inherited handles alone, tpd_client.h)."""

    def __init__(self, socket_path="", connect_timeout=None, cuda_pool_bytes=0):
        self._lib = _capi.library()
        handle = ctypes.c_void_p()
        self._ok(self._lib.tpd_client_open(
            _capi.b(socket_path or ""), _capi.timeout_us(connect_timeout), cuda_pool_bytes,
            ctypes.byref(handle)))
        self._handle = handle

    def close(self):
        handle, self._handle = self._handle, None
        if handle:
            self._lib.tpd_client_close(handle)

    def __del__(self):
        if getattr(self, "_handle", None):
            self.close()

    def detach(self):
        """Gives the client's handle up to whoever took it (the TPD agent, tpd.backend), which
        closes it: this object no longer uses or closes it."""
        self._handle = None

    def stop_events(self):
        if self._handle:
            self._lib.tpd_client_stop_events(self._handle)

    # --- groups ---

    def join(self, options, device_maps=None):
        """``options``: {key: value or [values]} as tpd_join_options_set takes them, but for
        times, in seconds under the key without its ``_us`` ("timeout", "rpc_timeout");
        ``device_maps``: {worker: {from: to}}. Returns the JoinResponse as a dict."""
        opts = self._lib.tpd_join_options_new()
        if not opts:
            raise MemoryError("tpd_join_options_new")
        try:
            for key, value in options.items():
                if key in _SECONDS_OPTIONS:
                    key, value = key + "_us", _capi.timeout_us(float(value))
                for v in value if isinstance(value, (list, tuple)) else [value]:
                    self._ok(self._lib.tpd_join_options_set(opts, _capi.b(key), _capi.b(v)))
            for worker, mapping in (device_maps or {}).items():
                for src, dst in mapping.items():
                    self._ok(self._lib.tpd_join_options_add_device_map(
                        opts, _capi.b(worker), _capi.b(src), _capi.b(dst)))
            out = ctypes.c_void_p()
            self._ok(self._lib.tpd_join(self._handle, opts, ctypes.byref(out)))
            return self._json(out.value)
        finally:
            self._lib.tpd_join_options_free(opts)

    def leave(self, group, name):
        self._ok(self._lib.tpd_leave(self._handle, _capi.b(group), _capi.b(name)))

    def barrier(self, group, name, timeout=None):
        """Waits until every member entered the barrier; returns the names of the members of a
        static group that were gone (left or died since it formed) and counted as arrived."""
        out = ctypes.c_void_p()
        self._ok(self._lib.tpd_barrier(self._handle, _capi.b(group), _capi.b(name),
                                       _capi.timeout_us(timeout), ctypes.byref(out)))
        return self._json(out.value).get("gone", [])

    def group(self, group, init_method=""):
        out = ctypes.c_void_p()
        self._ok(self._lib.tpd_get_group(self._handle, _capi.b(group), _capi.b(init_method),
                                         ctypes.byref(out)))
        return self._json(out.value)

    def user_secret(self, purpose):
        """32 bytes only this process's user gets for ``purpose``, the same from every daemon
        of the cluster (Control.UserSecret)."""
        out = ctypes.c_void_p()
        self._ok(self._lib.tpd_user_secret(self._handle, _capi.b(purpose), ctypes.byref(out)))
        return bytes.fromhex(self._string(out.value))

    def status(self):
        out = ctypes.c_void_p()
        self._ok(self._lib.tpd_status(self._handle, ctypes.byref(out)))
        return self._json(out.value)

    def arena_dlpack(self, nbytes):
        """A new block of ``nbytes`` of the shared arena as a "dltensor" capsule (uint8, 1-D),
        freed when the tensor made of it goes; sent where it lies (tpd_arena_dlpack)."""
        managed = ctypes.c_void_p()
        self._ok(self._lib.tpd_arena_dlpack(self._handle, nbytes, ctypes.byref(managed)))
        return _capsule(managed.value)

    def arena_in_flight(self, data_ptr):
        """Whether a sent message still holds the arena block starting at ``data_ptr``."""
        in_flight = ctypes.c_int()
        self._ok(self._lib.tpd_arena_in_flight(self._handle, data_ptr, ctypes.byref(in_flight)))
        return bool(in_flight.value)

    def call_stats(self):
        out = ctypes.c_void_p()
        self._ok(self._lib.tpd_call_stats(self._handle, ctypes.byref(out)))
        return self._json(out.value)

    # --- calls ---

    def serve(self, method):
        self._ok(self._lib.tpd_serve(self._handle, _capi.b(method)))

    def next_event(self, queues, timeout=None):
        """The next event of ``queues``, or None when none came within ``timeout`` seconds.
        TpdError CANCELLED once events are stopped."""
        out = ctypes.c_void_p()
        code = self._lib.tpd_next_event(self._handle, queues, _capi.timeout_us(timeout),
                                        ctypes.byref(out))
        if code == _capi.DEADLINE_EXCEEDED:
            return None
        self._ok(code)
        return Event(out.value)

    def call(self, group, worker, method, payload, tensors=(), timeout=None):
        """Calls and waits at most ``timeout`` seconds (0: no limit; None: the group's
        rpc_timeout); returns the reply Event (its status says whether it failed)."""
        array, n = _tensor_array(tensors)
        out = ctypes.c_void_p()
        code = self._lib.tpd_call(self._handle, _capi.b(group), _capi.b(worker),
                                  _capi.b(method), payload, len(payload), array, n,
                                  _capi.timeout_us(timeout), ctypes.byref(out))
        if not out.value:
            self._ok(code)  # refused before the call: bad arguments
        return Event(out.value)

    def call_async(self, group, worker, method, payload, tensors, timeout, tag, flags=0):
        """Starts a call (``timeout`` as call's); its reply arrives on the replies queue with
        ``tag``. ``flags``: CALL_REVERSE_MAP (tpd_call_async_flags)."""
        array, n = _tensor_array(tensors)
        self._ok(self._lib.tpd_call_async_flags(self._handle, _capi.b(group), _capi.b(worker),
                                                _capi.b(method), payload, len(payload), array,
                                                n, _capi.timeout_us(timeout), tag, flags))

    # --- the store ---

    def store(self, group="", namespace=""):
        """The daemon's store (``group`` ""), or the store ``group``'s members share on every
        node (this client must hold a member of it), under ``namespace``."""
        handle = ctypes.c_void_p()
        self._ok(self._lib.tpd_store_open(self._handle, _capi.b(group or ""),
                                          _capi.b(namespace or ""), ctypes.byref(handle)))
        return StoreHandle(self, handle)


class StoreHandle(_Library):
    """A store reached through a Client (Client.store), which it keeps alive."""

    def __init__(self, client, handle):
        self._client = client
        self._lib = client._lib
        self._store = handle

    def close(self):
        handle, self._store = self._store, None
        if handle:
            self._lib.tpd_store_close(handle)

    def __del__(self):
        if getattr(self, "_store", None):
            self.close()

    def set(self, key, value):
        self._ok(self._lib.tpd_store_set(self._store, _capi.b(key), value, len(value)))

    def get(self, key, timeout=None):
        out = ctypes.c_void_p()
        size = ctypes.c_size_t()
        self._ok(self._lib.tpd_store_get(self._store, _capi.b(key),
                                         _capi.timeout_us(timeout), ctypes.byref(out),
                                         ctypes.byref(size)))
        return self._bytes(out.value, size.value)

    def add(self, key, delta):
        result = ctypes.c_int64()
        self._ok(self._lib.tpd_store_add(self._store, _capi.b(key), delta,
                                         ctypes.byref(result)))
        return result.value

    def compare_set(self, key, expected, desired):
        out = ctypes.c_void_p()
        size = ctypes.c_size_t()
        self._ok(self._lib.tpd_store_compare_set(self._store, _capi.b(key), expected,
                                                 len(expected), desired, len(desired),
                                                 ctypes.byref(out), ctypes.byref(size)))
        return self._bytes(out.value, size.value)

    def _keys(self, keys):
        encoded = [_capi.b(k) for k in keys]
        return (ctypes.c_char_p * max(1, len(encoded)))(*encoded), len(encoded)

    def wait(self, keys, timeout=None):
        array, n = self._keys(keys)
        self._ok(self._lib.tpd_store_wait(self._store, array, n, _capi.timeout_us(timeout)))

    def check(self, keys):
        array, n = self._keys(keys)
        ready = ctypes.c_int()
        self._ok(self._lib.tpd_store_check(self._store, array, n, ctypes.byref(ready)))
        return bool(ready.value)

    def delete_key(self, key):
        deleted = ctypes.c_int()
        self._ok(self._lib.tpd_store_delete_key(self._store, _capi.b(key),
                                                ctypes.byref(deleted)))
        return bool(deleted.value)

    def num_keys(self):
        n = ctypes.c_int64()
        self._ok(self._lib.tpd_store_num_keys(self._store, ctypes.byref(n)))
        return n.value
