"""ctypes bindings of libtpd_client.so (client/c/tpd_client.h).

Only this module touches ctypes. It finds the library, declares each function's signature,
and turns a failed call into an exception carrying the library's code and message. ctypes
releases the GIL for every call into the library, so a thread blocked in ``next_event`` or in a
call lets the interpreter run.
"""

import ctypes
import json
import os
import pathlib
import threading

ABI_VERSION = 4

# Status codes (gRPC's).
OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
ALREADY_EXISTS = 6
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14

CODE_NAMES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
    13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}

TIMEOUT_DEFAULT = -1
CPU = 0
CUDA = 1
CALL_REVERSE_MAP = 1  # tpd_call_async_flags
EVENT_REQUEST = 1
EVENT_REPLY = 2
EVENT_RELEASED = 3
QUEUE_REQUESTS = 1
QUEUE_REPLIES = 2


class TpdError(RuntimeError):
    """A failed library call: ``code`` is the gRPC code, the message the daemon's or library's."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.code_name = CODE_NAMES.get(code, str(code))


class Tensor(ctypes.Structure):
    _fields_ = [
        ("dtype", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * 8),
        ("data", ctypes.c_void_p),
        ("nbytes", ctypes.c_uint64),
        ("device_type", ctypes.c_int32),
        ("device_index", ctypes.c_int32),
        ("stream", ctypes.c_void_p),
    ]


class EventInfo(ctypes.Structure):
    """tpd_event_read's answer: an event's kind, status, tag, payload and tensor count."""

    _fields_ = [
        ("kind", ctypes.c_int32),
        ("code", ctypes.c_int32),
        ("tag", ctypes.c_uint64),
        ("message", ctypes.c_char_p),
        ("payload", ctypes.c_void_p),
        ("payload_size", ctypes.c_uint64),
        ("num_tensors", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
    ]


_lib = None
_lib_lock = threading.Lock()


def _candidates():
    explicit = os.environ.get("TPD_CLIENT_LIBRARY")
    if explicit:
        yield pathlib.Path(explicit)
        return
    here = pathlib.Path(__file__).resolve().parent
    yield here / "_lib" / "libtpd_client.so"  # installed with pip
    for parent in here.parents:  # a source tree: <repo>/bazel-bin/client/c/
        yield parent / "bazel-bin" / "client" / "c" / "libtpd_client.so"


def library():
    """The loaded library, loading it on first use (never at import: fork-safe)."""
    global _lib
    lib = _lib
    if lib is not None:  # loaded: no lock on the calls' path (every event asks)
        return lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in _candidates():
            tried.append(str(path))
            if path.is_file():
                lib = _load(path)
                lib.tpd_abi_version.restype = ctypes.c_int
                lib.tpd_abi_version.argtypes = []
                if lib.tpd_abi_version() != ABI_VERSION:
                    raise RuntimeError(
                        f"{path} has ABI version {lib.tpd_abi_version()}, tpd's Python package "
                        f"wants {ABI_VERSION}: install matching versions")
                _declare(lib, path)
                _check_layouts(lib, path)
                _lib = lib
                return lib
        raise RuntimeError(
            "libtpd_client.so not found (set TPD_CLIENT_LIBRARY, or build it with "
            "`bazel build //client/c:libtpd_client.so`); looked at: " + ", ".join(tried))


_LM_ID_NEWLM = -1
_RTLD_NOW = 2


def _load(path):
    """The library at ``path``: the process's copy, or in a child forked after its parent loaded
    one, a copy of the child's own (see "Handles and fork")."""
    if _forked_from is None:
        return ctypes.CDLL(str(path))
    libc = ctypes.CDLL(None)
    libc.dlmopen.restype = ctypes.c_void_p
    libc.dlmopen.argtypes = [ctypes.c_long, ctypes.c_char_p, ctypes.c_int]
    libc.dlerror.restype = ctypes.c_char_p
    handle = libc.dlmopen(_LM_ID_NEWLM, os.fsencode(path), _RTLD_NOW)
    if not handle:
        raise RuntimeError(
            f"this process (pid {os.getpid()}) was forked from process {_forked_from} after "
            f"tpd's client library was loaded there, and a copy of its own could not be loaded "
            f"({(libc.dlerror() or b'').decode('utf-8', 'replace')}): start processes that "
            "use tpd with multiprocessing's 'spawn' or 'forkserver' start method, or exec them")
    return ctypes.CDLL(str(path), handle=handle)


def _declare(lib, path):
    c = ctypes
    p = c.c_void_p
    pp = c.POINTER(c.c_void_p)
    s = c.c_char_p
    i64 = c.c_int64
    signatures = {
        "tpd_abi_version": (c.c_int, []),
        "tpd_last_error": (s, []),
        "tpd_free": (None, [p]),
        "tpd_client_open": (c.c_int, [s, i64, c.c_uint64, pp]),
        "tpd_client_close": (None, [p]),
        "tpd_client_stop_events": (None, [p]),
        "tpd_join_options_new": (p, []),
        "tpd_join_options_free": (None, [p]),
        "tpd_join_options_set": (c.c_int, [p, s, s]),
        "tpd_join_options_add_device_map": (c.c_int, [p, s, s, s]),
        "tpd_join": (c.c_int, [p, p, pp]),
        "tpd_leave": (c.c_int, [p, s, s]),
        "tpd_barrier": (c.c_int, [p, s, s, i64, pp]),
        "tpd_get_group": (c.c_int, [p, s, s, pp]),
        "tpd_status": (c.c_int, [p, pp]),
        "tpd_user_secret": (c.c_int, [p, s, pp]),
        "tpd_arena_alloc": (c.c_int, [p, c.c_uint64, pp]),
        "tpd_arena_free": (None, [p, p]),
        "tpd_arena_in_flight": (c.c_int, [p, p, c.POINTER(c.c_int)]),
        "tpd_arena_dlpack": (c.c_int, [p, c.c_uint64, pp]),
        "tpd_serve": (c.c_int, [p, s]),
        "tpd_next_event": (c.c_int, [p, c.c_int, i64, pp]),
        "tpd_event_free": (None, [p]),
        "tpd_event_kind": (c.c_int, [p]),
        "tpd_event_tag": (c.c_uint64, [p]),
        "tpd_event_status": (c.c_int, [p, c.POINTER(c.c_char_p)]),
        "tpd_event_payload": (p, [p, c.POINTER(c.c_size_t)]),
        "tpd_event_method": (s, [p]),
        "tpd_event_caller": (s, [p]),
        "tpd_event_num_tensors": (c.c_int, [p]),
        "tpd_event_read": (c.c_int, [p, c.POINTER(EventInfo)]),
        "tpd_event_tensor": (c.c_int, [p, c.c_int, c.POINTER(Tensor)]),
        "tpd_event_tensor_dlpack": (c.c_int, [p, c.c_int, c.c_int, pp]),
        "tpd_reply": (c.c_int, [p, c.c_char_p, c.c_size_t, c.POINTER(Tensor), c.c_int,
                                c.c_uint64]),
        "tpd_reply_error": (c.c_int, [p, c.c_int, s]),
        "tpd_call": (c.c_int, [p, s, s, s, c.c_char_p, c.c_size_t, c.POINTER(Tensor), c.c_int,
                               i64, pp]),
        "tpd_call_async": (c.c_int, [p, s, s, s, c.c_char_p, c.c_size_t, c.POINTER(Tensor),
                                     c.c_int, i64, c.c_uint64]),
        "tpd_call_async_flags": (c.c_int, [p, s, s, s, c.c_char_p, c.c_size_t,
                                           c.POINTER(Tensor), c.c_int, i64, c.c_uint64,
                                           c.c_uint32]),
        "tpd_store_open": (c.c_int, [p, s, s, pp]),
        "tpd_store_close": (None, [p]),
        "tpd_store_set": (c.c_int, [p, s, c.c_char_p, c.c_size_t]),
        "tpd_store_get": (c.c_int, [p, s, i64, pp, c.POINTER(c.c_size_t)]),
        "tpd_store_add": (c.c_int, [p, s, i64, c.POINTER(i64)]),
        "tpd_store_compare_set": (c.c_int, [p, s, c.c_char_p, c.c_size_t, c.c_char_p,
                                            c.c_size_t, pp, c.POINTER(c.c_size_t)]),
        "tpd_store_wait": (c.c_int, [p, c.POINTER(c.c_char_p), c.c_int, i64]),
        "tpd_store_check": (c.c_int, [p, c.POINTER(c.c_char_p), c.c_int,
                                      c.POINTER(c.c_int)]),
        "tpd_store_delete_key": (c.c_int, [p, s, c.POINTER(c.c_int)]),
        "tpd_store_num_keys": (c.c_int, [p, c.POINTER(i64)]),
        "tpd_call_stats": (c.c_int, [p, pp]),
        "tpd_layout": (c.c_size_t, [c.c_char_p, c.c_char_p]),
    }
    for name, (restype, argtypes) in signatures.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:  # an older library of the same ABI version
            raise RuntimeError(f"{path} lacks {name}, which tpd's Python package calls: "
                               "install matching versions") from None
        fn.restype = restype
        fn.argtypes = argtypes


def _check_layouts(lib, path):
    """Checks the structs this module mirrors by hand against the library's (tpd_layout): a
    field out of place would be read and written wrong without a word."""
    for struct, name in ((Tensor, "tpd_tensor"), (EventInfo, "tpd_event_info")):
        wanted = [(None, ctypes.sizeof(struct))]
        wanted += [(field, getattr(struct, field).offset) for field, _ in struct._fields_]
        for field, value in wanted:
            got = lib.tpd_layout(name.encode(), field.encode() if field else None)
            if got != value:
                what = f"{name}.{field} is at offset" if field else f"{name} is"
                raise RuntimeError(f"{path}: {what} {got} there, {value} in tpd's Python "
                                   "package: install matching versions")


def check(code, lib=None):
    """Raises TpdError for a failed call of ``lib`` (the loaded library when None; the message
    read on this thread, as the ABI says)."""
    if code != OK:
        raise TpdError(code, (lib or library()).tpd_last_error().decode("utf-8", "replace"))


def b(text):
    """A name as the library takes it: UTF-8, passed through when encoded already."""
    if text is None or isinstance(text, bytes):
        return text
    return str(text).encode("utf-8")


def take_string(ptr, lib=None):
    """The char* ``lib`` (the loaded library when None) returned, freed here, as str."""
    if not ptr:
        return ""
    try:
        return ctypes.string_at(ptr).decode("utf-8")
    finally:
        (lib or library()).tpd_free(ptr)


def take_bytes(ptr, size, lib=None):
    if not ptr:
        return b""
    try:
        return ctypes.string_at(ptr, size)
    finally:
        (lib or library()).tpd_free(ptr)


def take_json(ptr, lib=None):
    return json.loads(take_string(ptr, lib))


# --- Handles and fork ---
#
# A forked child (a DataLoader worker, multiprocessing's "fork") inherits its parent's
# handles: the client, events, store handles, whose sockets and shared memory the two
# processes share. The library itself leaves them alone there (tpd_client.h, "Across
# fork()"), so dropping them in a child costs the parent nothing. What uses the parent's
# session on purpose (tpd.rpc's agent) asks is_mine() first.
#
# _pid is os.getpid() kept at hand, since every call asks and os.getpid() is a system call.
# It is None from the start of a fork until its hooks ran.
#
# A child that opens clients of its own (its own init_rpc, a tpd.Store) gets a copy of the
# library of its own: the parent's copy keeps gRPC's polling in one epoll set per process,
# which the child shares with its parent, so a connection made through it hangs while the
# parent's gRPC thread takes the child's events, and crashes on them (seen with a serving
# parent every time). library() loads the fresh copy with dlmopen(LM_ID_NEWLM): a link-map
# namespace of its own, so its gRPC, its threads and its epoll set are the child's alone, while
# the handles the child inherited keep calling the parent's copy, which leaves them alone.
_pid = os.getpid()
_forked_from = None  # in a child forked after the library was loaded: its parent


def _forking():
    global _pid
    _pid = None


def _forked_in_parent():
    global _pid
    _pid = os.getpid()


def _forked_in_child():
    global _pid, _forked_from, _lib, _lib_lock
    _pid = os.getpid()
    _lib_lock = threading.Lock()  # another thread of the parent may have held it
    if _lib is not None:
        _forked_from = os.getppid()
        _lib = None


os.register_at_fork(before=_forking, after_in_parent=_forked_in_parent,
                    after_in_child=_forked_in_child)


def is_mine(made_in):
    """Whether what process ``made_in`` made is this process's to use."""
    return made_in == _pid or made_in == os.getpid()


def timeout_us(seconds):
    """Seconds (float, None for the default) as the ABI's microseconds."""
    if seconds is None:
        return TIMEOUT_DEFAULT
    return int(round(seconds * 1e6))
