"""RRef: a reference to a value that lives on one worker (its owner).

Counting. Every RRef object holds one count on its owner's entry, in the name of the worker
it lives in (``Agent.own``): the owner drops the value when no worker holds any. ``remote()``
counts the creator's RRef on the owner; pickling an RRef into a call or a reply (``_fork``)
adds one for the RRef the receiver will build, before the message leaves (a synchronous call
to the owner, which takes it only from a worker holding the RRef, or a local count on the
owner itself); an RRef object going away gives its count back (a fire-and-forget call from a
user, which the owner takes only from a worker holding the RRef).
"""

import threading
from typing import Any

import torch
from torch._C._distributed_rpc import WorkerInfo

from tpd.rpc import _agent, _pickler, _state
from tpd.rpc.constants import UNSET_RPC_TIMEOUT

# torch's words: an RRef travels only in RPC messages, which say who receives it.
_NOT_IN_RPC = "Can not pickle rref in python pickler, rref can only be pickled when using RPC"


def _current():
    return _state.require_initialized()


def create_remote(agent, owner, func, args, kwargs, timeout):
    """remote(): the RRef, at once; the owner runs ``func`` and keeps what it returns."""
    rref_id = agent.new_rref_id()
    rref = RRef._created(agent, owner, rref_id)
    confirmation = agent.call_async(
        owner, (_agent.REMOTE, rref_id, func, tuple(args), dict(kwargs)), timeout)
    rref._confirm_with(confirmation)
    return rref


class RRef:
    """A reference to a value on one worker, its owner: torch's ``torch.distributed.rpc.RRef``
    on tpd. ``remote()`` returns one; ``RRef(value)`` makes one this worker owns. RRefs go
    to other workers as arguments and return values of calls; the owner keeps the value while
    any worker holds an RRef to it.

    Args:
        value: the value this worker will own.
        type_hint: accepted, as torch accepts it (used by TorchScript only).

    Raises:
        RuntimeError: RPC not initialized.
    """

    # RRef[T] in annotations, as torch's RRef allows.
    __class_getitem__ = classmethod(lambda cls, item: cls)

    def __init__(self, value: Any = None, type_hint: Any = None) -> None:
        agent = _current()
        future = torch.futures.Future()
        future.set_result(value)
        self._init(agent, agent.info, agent.new_rref_id(), confirmed=True)
        agent.own(self._id, future, agent.info.name)

    def _init(self, agent, owner, rref_id, confirmed):
        self._agent = agent
        self._owner = owner
        self._id = rref_id
        self._confirmed = confirmed
        self._confirmation = None
        self._type = None
        self._counted = True

    @classmethod
    def _created(cls, agent, owner, rref_id):
        """The RRef remote() returns (the owner counts it when it runs the REMOTE)."""
        rref = cls.__new__(cls)
        rref._init(agent, owner, rref_id, confirmed=False)
        return rref

    def _confirm_with(self, future):
        self._confirmation = future

        def confirmed(done):
            try:
                done.wait()
                self._confirmed = True
            except Exception:  # to_here reports it
                pass
        future.then(confirmed)

    # --- what torch's RRef offers ---

    def owner(self) -> WorkerInfo:
        """The ``WorkerInfo`` of the worker that owns the value."""
        return self._owner

    def owner_name(self) -> str:
        """The name of the worker that owns the value."""
        return self._owner.name

    def is_owner(self) -> bool:
        """Whether this worker owns the value."""
        return self._owner.name == self._agent.info.name

    def confirmed_by_owner(self) -> bool:
        """Whether the owner has the value (``remote()``'s function ran there)."""
        return self._confirmed or self.is_owner()

    def local_value(self) -> Any:
        """The value, on its owner.

        Raises:
            RuntimeError: called on a worker that is not the owner (torch's words).
        """
        if not self.is_owner():
            raise RuntimeError(
                f"For UserRRef(rref_id={self._id}, owner={self._owner}), can't call "
                f"localValue() on user {self._agent.info}. Call it on owner {self._owner}")
        self._wait_confirmed(None)
        return _unwrap(self._agent.owned(self._id).future)

    def to_here(self, timeout: float = UNSET_RPC_TIMEOUT) -> Any:
        """A copy of the value, fetched from its owner (the value itself on the owner).

        Args:
            timeout (float): seconds, for the fetch and for the creation it waits for
                (0: none; default: ``get_rpc_timeout()``).

        Raises:
            RuntimeError: the creation failed (``remote()``'s function raised: that error),
                timed out, or the owner is gone; this worker shut down (torch's words).
        """
        self._check_not_deleted("to_here()")
        if self.is_owner():
            return self.local_value()
        self._wait_confirmed(timeout)
        return self._agent.call_sync(self._owner, (_agent.FETCH, self._id), timeout)

    def _check_not_deleted(self, action):
        # torch's words: shutdown() deletes a worker's user RRefs.
        if self._agent.stopped and not self.is_owner():
            raise RuntimeError(f"User RRef with RRefId={self._id} and ForkId={self._id} has been "
                               f"deleted. Cannot call {action} on it after deletion.")

    def _get_future(self):
        """The future of this RRef's creation on its owner (torch's, for profiling and tests):
        done once the owner ran the function remote() sent, failed with what failed it (a
        timeout, say); done already for an RRef this worker built or received."""
        if self._confirmation is not None:
            return self._confirmation
        done = torch.futures.Future()
        done.set_result(None)
        return done

    def _serialize(self):
        # torch's own pickler (torch.distributed.rpc.internal) asks for this; tpd.rpc's RRefs
        # travel only in tpd.rpc's messages, which say who receives them.
        if self._agent.stopped and not self.is_owner():
            raise RuntimeError("Cannot call fork an UserRRef after deletion.")
        raise RuntimeError(_NOT_IN_RPC)

    def _wait_confirmed(self, timeout):
        """Waits until the owner ran remote()'s function, at most the call's `timeout` (torch's
        timeout error past it), and raises the creation's error if it failed."""
        confirmation = self._confirmation
        if confirmation is None:
            return
        # In a forked child the confirmation would never come (the parent's agent's).
        self._agent.check_process()
        seconds = self._agent.timeout_seconds(timeout)
        if seconds > 0 and not confirmation.done():
            done = threading.Event()
            confirmation.add_done_callback(lambda _: done.set())
            if not done.wait(seconds):
                raise _agent.timeout_error(seconds)
        confirmation.wait()

    def rpc_sync(self, timeout: float = UNSET_RPC_TIMEOUT) -> "_Proxy":
        """A proxy whose attribute ``m`` calls ``self.to_here().m(*args, **kwargs)`` on the
        owner with ``rpc_sync``, as torch's ``RRef.rpc_sync()``.

        Args:
            timeout (float): seconds for each call made through the proxy.
        """
        return _Proxy(self, "rpc_sync", timeout)

    def rpc_async(self, timeout: float = UNSET_RPC_TIMEOUT) -> "_Proxy":
        """A proxy whose attribute ``m`` calls ``self.to_here().m(*args, **kwargs)`` on the
        owner with ``rpc_async``, as torch's ``RRef.rpc_async()``.

        Args:
            timeout (float): seconds for each call made through the proxy.
        """
        return _Proxy(self, "rpc_async", timeout)

    def remote(self, timeout: float = UNSET_RPC_TIMEOUT) -> "_Proxy":
        """A proxy whose attribute ``m`` calls ``self.to_here().m(*args, **kwargs)`` on the
        owner with ``remote``, as torch's ``RRef.remote()``.

        Args:
            timeout (float): seconds for each call made through the proxy.
        """
        return _Proxy(self, "remote", timeout)

    def _value_type(self, timeout=UNSET_RPC_TIMEOUT):
        kind = getattr(self, "_type", None)
        if kind is None:
            kind = self._type = self._get_type(timeout)
        return kind

    def _get_type(self, timeout=UNSET_RPC_TIMEOUT, blocking=True):
        """The type of the value (torch's). Blocking, errors are raised here; else a Future
        that fails with them (the owner's error, a timeout)."""
        if not blocking:
            future = torch.futures.Future()

            def settle():
                try:
                    future.set_result(self._get_type(timeout))
                except Exception as exc:
                    future.set_exception(exc)
            threading.Thread(target=settle, name="tpd-rref-type", daemon=True).start()
            return future
        # The creation counts against the timeout too: a remote() still running its function
        # must not hold this call past it.
        self._wait_confirmed(timeout)
        return self._agent.call_sync(self._owner, (_agent.CALL, _type_of, (self,), {}), timeout)

    def __repr__(self):
        kind = "OwnerRRef" if self.is_owner() else "UserRRef"
        return f"{kind}(RRefId = {self._id}, owner = {self._owner})"

    # --- counting ---

    def __reduce__(self):
        raise RuntimeError(_NOT_IN_RPC)

    def __del__(self):
        if not getattr(self, "_counted", False):
            return
        self._counted = False
        agent = _state.current
        if agent is None or agent is not self._agent:
            return  # shut down (the owner's table went with it), or a forked child's copy
        try:
            if self.is_owner():
                agent.release(self._id, agent.info.name)
            elif self._confirmed:
                agent.call_async(self._owner, (_agent.RREF_DEL, self._id)).then(_ignore)
        except Exception:  # the owner or this agent is going away: nothing left to count
            pass


def _fork(rref, receiver):
    """Pickles ``rref`` into a message to worker ``receiver``: the owner counts the RRef the
    receiver will build before the message leaves."""
    if receiver is None:
        raise RuntimeError(_NOT_IN_RPC)
    agent = rref._agent
    # Counted only once the owner registered the value (a remote() still in flight, even
    # one to this very worker, has not), or the count would land on nothing.
    rref._wait_confirmed(None)
    if rref.is_owner():
        if not agent.fork(rref._id, agent.info.name, receiver):
            raise RuntimeError(f"RRef {rref._id} is not owned by {agent.info} (deleted?)")
    else:
        agent.call_sync(rref._owner, (_agent.RREF_ADD, rref._id, receiver))
    return _rebuild, (rref._owner.name, rref._owner.id, rref._id)


def _ignore(_):
    pass


def _unwrap(future):
    try:
        return future.wait()
    except _agent._RemoteError as error:
        error.reraise()


def _rebuild(owner_name, owner_id, rref_id):
    agent = _current()
    rref = RRef.__new__(RRef)
    rref._init(agent, WorkerInfo(owner_name, owner_id), rref_id, confirmed=True)
    return rref


_pickler.by_receiver[RRef] = _fork


def _type_of(rref):
    return type(rref.local_value())


def _invoke_method(rref, name, args, kwargs):
    method = getattr(rref.local_value(), name)
    result = method(*args, **kwargs)
    if getattr(method, "_wrapped_async_rpc_function", None) is not None:
        return _agent.AsyncResult(result)
    return result


class _Proxy:
    """``rref.rpc_sync().method(...)`` and friends: the method runs on the owner."""

    def __init__(self, rref, how, timeout):
        self._rref = rref
        self._how = how
        self._timeout = timeout

    def __getattr__(self, name):
        rref = self._rref
        # As torch: a method the value's type lacks fails here, before any call is made.
        kind = rref._value_type(self._timeout)
        if not hasattr(kind, name):
            raise AttributeError(f"'{kind.__name__}' object has no attribute '{name}'")

        def method(*args, **kwargs):
            call = (rref, name, args, kwargs)
            if self._how == "rpc_sync":
                return rref._agent.call_sync(rref.owner(), (_agent.CALL, _invoke_method, call, {}),
                                             self._timeout)
            if self._how == "rpc_async":
                return rref._agent.call_async(rref.owner(),
                                              (_agent.CALL, _invoke_method, call, {}),
                                              self._timeout)
            return create_remote(rref._agent, rref.owner(), _invoke_method, call, {},
                                 self._timeout)
        return method
