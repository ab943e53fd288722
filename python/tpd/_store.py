"""tpd.Store: a torch.distributed.Store over the node daemon's store.

    store = tpd.Store(namespace="job-42")
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)

Keys live in the daemon (c10d semantics: proto/store.proto) under ``namespace``; the Store
survives the processes that use it, not the daemon.

``tpd.rpc.group_store()`` gives the same class over the store that a tpd.rpc job's workers
share on every node (their group's rendezvous store).
"""

from datetime import timedelta

import torch.distributed as dist

from tpd import _capi
from tpd._client import Client

_DEFAULT_TIMEOUT = timedelta(seconds=300)  # torch's Store default


def _as_bytes(value):
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"store value must be bytes or str, not {type(value).__name__}")


def _seconds(timeout):
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    raise TypeError(f"timeout must be a datetime.timedelta, not {type(timeout).__name__}")


class Store(dist.Store):
    """A c10d Store whose keys live in the tpd daemon of this node.

    ``socket_path``: the daemon's socket ("" : the default one). ``namespace``: keeps this
    store's keys apart from other jobs' (the daemon also bounds each namespace).
    ``timeout``: how long ``get`` and ``wait`` wait (torch's default 300 s).
    """

    def __init__(self, socket_path="", namespace="", timeout=_DEFAULT_TIMEOUT, *, _store=None):
        super().__init__()
        _seconds(timeout)
        self._timeout = timeout
        # `_store`: a StoreHandle of a client that already exists (tpd.rpc.group_store).
        self._store = _store or Client(socket_path).store(namespace=namespace)

    @property
    def timeout(self):
        return self._timeout

    def set_timeout(self, timeout):
        _seconds(timeout)
        self._timeout = timeout

    def _call(self, operation, *args):
        """The client's store `operation`, its errors as torch's stores raise them:
        RuntimeError, with "Timeout" for waits that ran out."""
        try:
            return operation(*args)
        except _capi.TpdError as error:
            if error.code == _capi.DEADLINE_EXCEEDED:
                raise RuntimeError(f"Socket Timeout: {error}") from None
            raise RuntimeError(str(error)) from None

    def set(self, key, value):
        self._call(self._store.set, key, _as_bytes(value))

    def get(self, key):
        return self._call(self._store.get, key, _seconds(self._timeout))

    def add(self, key, value):
        return self._call(self._store.add, key, int(value))

    def compare_set(self, key, expected_value, desired_value):
        return self._call(self._store.compare_set, key, _as_bytes(expected_value),
                          _as_bytes(desired_value))

    def wait(self, keys, timeout=None):
        self._call(self._store.wait, list(keys), _seconds(timeout or self._timeout))

    def check(self, keys):
        return self._call(self._store.check, list(keys))

    def delete_key(self, key):
        return self._call(self._store.delete_key, key)

    def num_keys(self):
        return self._call(self._store.num_keys)
