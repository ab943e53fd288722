"""tpd.Store: a torch.distributed.Store over the node daemon's store.

    store = tpd.Store(namespace="job-42")
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)

Keys live in the daemon (c10d semantics: proto/store.proto) under ``namespace``; the Store
survives the processes that use it, not the daemon.

``tpd.rpc.group_store()`` gives the same class over the store that a tpd.rpc job's workers
share on every node (their group's rendezvous store).
"""

from datetime import timedelta
from typing import Any, Iterable, Optional, Union

import torch.distributed as dist

from tpd import _client
from tpd._client import Client

_DEFAULT_TIMEOUT = timedelta(seconds=300)  # torch's Store default


_Value = Union[bytes, bytearray, memoryview, str]


def _as_bytes(value: _Value) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"store value must be bytes or str, not {type(value).__name__}")


def _seconds(timeout: timedelta) -> float:
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    raise TypeError(f"timeout must be a datetime.timedelta, not {type(timeout).__name__}")


class Store(dist.Store):
    """A c10d Store whose keys live in the tpd daemon of this node: usable wherever torch
    takes a ``torch.distributed.Store`` (``init_process_group(store=...)``, say).

    Args:
        socket_path (str): the daemon's socket ("": the default one, ``$TPD_SOCKET`` or the
            system's).
        namespace (str): keeps this store's keys apart from other jobs' (the daemon also
            bounds each namespace's keys and bytes).
        timeout (datetime.timedelta): how long ``get`` and ``wait`` wait (torch's default,
            300 s).

    Raises:
        TypeError: ``timeout`` not a ``timedelta``.
        tpd._client.TpdError: no daemon at the socket, or one this user may not trust (naming
            the socket and why).

    Every operation raises ``RuntimeError`` as torch's stores do: with "Timeout" in its
    message for a ``get`` or ``wait`` that ran out, the daemon's reason otherwise.
    """

    def __init__(self, socket_path: str = "", namespace: str = "",
                 timeout: timedelta = _DEFAULT_TIMEOUT, *, _store: Any = None) -> None:
        super().__init__()
        _seconds(timeout)
        self._timeout = timeout
        # `_store`: a StoreHandle of a client that already exists (tpd.rpc.group_store).
        self._store = _store or Client(socket_path).store(namespace=namespace)

    @property
    def timeout(self) -> timedelta:
        """How long ``get`` and ``wait`` wait."""
        return self._timeout

    def set_timeout(self, timeout: timedelta) -> None:
        """Sets how long ``get`` and ``wait`` wait (a ``timedelta``)."""
        _seconds(timeout)
        self._timeout = timeout

    def _call(self, operation, *args):
        """The client's store `operation`, its errors as torch's stores raise them:
        RuntimeError, with "Timeout" for waits that ran out."""
        try:
            return operation(*args)
        except _client.TpdError as error:
            if error.code == _client.DEADLINE_EXCEEDED:
                raise RuntimeError(f"Socket Timeout: {error}") from None
            raise RuntimeError(str(error)) from None

    def set(self, key: str, value: _Value) -> None:
        """Sets ``key`` to ``value``.

        Args:
            key (str): the key.
            value (bytes or str): its value (a str is stored as UTF-8).
        """
        self._call(self._store.set, key, _as_bytes(value))

    def get(self, key: str) -> bytes:
        """The value of ``key``, waiting up to the store's timeout for it to be set."""
        return self._call(self._store.get, key, _seconds(self._timeout))

    def add(self, key: str, value: int) -> int:
        """Adds ``value`` to the counter at ``key`` (0 if unset).

        Args:
            key (str): the counter's key.
            value (int): what to add (may be negative).

        Returns:
            The counter after the addition.
        """
        return self._call(self._store.add, key, int(value))

    def compare_set(self, key: str, expected_value: _Value, desired_value: _Value) -> bytes:
        """Sets ``key`` to ``desired_value`` if it holds ``expected_value``, as one step.

        Args:
            key (str): the key.
            expected_value (bytes or str): what it must hold (empty: it must be unset).
            desired_value (bytes or str): what it holds after, if so.

        Returns:
            The value ``key`` holds after the call.
        """
        return self._call(self._store.compare_set, key, _as_bytes(expected_value),
                          _as_bytes(desired_value))

    def wait(self, keys: Iterable[str], timeout: Optional[timedelta] = None) -> None:
        """Waits until every key of ``keys`` is set.

        Args:
            keys (Iterable[str]): the keys.
            timeout (datetime.timedelta, optional): at most this long (None: the store's).
        """
        self._call(self._store.wait, list(keys), _seconds(timeout or self._timeout))

    def check(self, keys: Iterable[str]) -> bool:
        """Whether every key of ``keys`` is set, without waiting."""
        return self._call(self._store.check, list(keys))

    def delete_key(self, key: str) -> bool:
        """Deletes ``key``; whether it was there."""
        return self._call(self._store.delete_key, key)

    def num_keys(self) -> int:
        """How many keys this store's namespace holds."""
        return self._call(self._store.num_keys)
