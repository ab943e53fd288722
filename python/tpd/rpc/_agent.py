"""The process's RPC agent on tpd: one client of the node's daemon, the threads that serve
incoming calls and complete outgoing ones, and the RRefs this worker owns.

Every message between workers is one tpd call of method ``tpd.rpc`` whose payload is a pickle
(``_pickler``) of ``(kind, ...)``; the reply is a pickle of ``(True, value)`` or
``(False, exception type, message)``. Threads:

- ``num_worker_threads`` "tpd-rpc-worker" threads take requests off the library's request
  queue (blocked in C with the GIL released) and run them; a call to an
  ``@async_execution`` function answers when its future completes, from whichever thread
  completes it;
- ``num_worker_threads`` "tpd-rpc-replies" threads complete the futures of ``rpc_async`` and
  ``remote`` (their callbacks run there, as torch runs them on its agent's pool: a callback
  that waits for another call leaves the others to deliver its reply).
"""

import itertools
import logging
import os
import sys
import threading
import traceback

import torch
from torch._C._distributed_rpc import WorkerInfo

from tpd import _client
from tpd.rpc import _pickler, _state

METHOD = "tpd.rpc"
_METHOD_BYTES = METHOD.encode()

# Message kinds.
CALL = 0      # (CALL, func, args, kwargs)
REMOTE = 1    # (REMOTE, rref_id, func, args, kwargs): run, keep the result as an OwnerRRef
FETCH = 2     # (FETCH, rref_id): the owner's value, once there
RREF_ADD = 3  # (RREF_ADD, rref_id, receiver): the caller passes its RRef on to receiver
RREF_DEL = 4  # (RREF_DEL, rref_id): the caller's RRef went away

TIMEOUT_MESSAGE = "RPC ran for more than set timeout ({} ms) and will now be marked with an error"

_log = logging.getLogger(__name__)


def timeout_error(timeout_s):
    return RuntimeError(TIMEOUT_MESSAGE.format(int(timeout_s * 1000)))


class _Owned:
    """A value this worker owns for RRefs: its future, and for each worker holding RRef objects
    of it (this one included) how many."""

    __slots__ = ("future", "holders")

    def __init__(self, future, holder):
        self.future = future
        self.holders = {holder: 1}


def remote_exception_message(worker_info, exc):
    # torch's wording, which programs and tests match on.
    return f"On {worker_info}:\n{repr(exc)}\n{traceback.format_exc()}"


def raise_remote(exc_type, message):
    # As torch: the message went through unicode_escape on the way out of the callee.
    decoded = message.encode("utf-8").decode("unicode_escape")
    try:
        exc = exc_type(decoded)
    except Exception:  # an exception type whose constructor wants more
        exc = RuntimeError(decoded)
    raise exc


class Agent:
    def __init__(self, client, group, info, options, world_size, bootstrap_store):
        self.client = client
        self.group = group
        self._group_bytes = _client.b(group)  # encoded once: every call passes it
        self.info = info
        self.rpc_timeout = float(options.rpc_timeout)
        self.world_size = world_size
        self._bootstrap_store = bootstrap_store  # torch's rendezvous store, kept as torch does
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # _in_flight fell to 0 (wait_idle)
        self._in_flight = 0      # calls this worker made that have not completed
        self._idle_waiters = 0   # threads in wait_idle: only they need _idle notified
        self._workers_by_name = {}
        self._workers_by_id = {}
        self._tags = itertools.count(1)
        self._pending = {}       # tag -> (future, tensors kept until done, timeout in s)
        self._owned = {}         # rref id -> _Owned
        self._rref_ids = itertools.count(1)
        self._cuda_replies = {}  # release tag -> CUDA tensors of a reply the daemon still reads
        self._threads = []
        self._stopped = False
        self.num_worker_threads = int(options.num_worker_threads)
        self.pid = os.getpid()  # the process it serves (a forked child inherits it unusable)

    # --- lifecycle ---

    def start(self):
        self.client.serve(METHOD)
        for i in range(self.num_worker_threads):
            self._spawn(self._serve_loop, f"tpd-rpc-worker-{i}")
        # Replies complete futures, and a future's then() callbacks run on the thread that
        # completes it: one that waits for another call's reply must leave others to deliver
        # it. As torch's agent runs callbacks on its pool, so this pool has as many threads.
        for i in range(self.num_worker_threads):
            self._spawn(self._reply_loop, f"tpd-rpc-replies-{i}")

    def _spawn(self, target, name):
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def check_process(self):
        """Raises in a forked child: this agent's threads and session are its parent's."""
        if not _client.is_mine(self.pid):
            raise _state.forked_error(self.pid)

    @property
    def stopped(self):
        """Whether stop() ran: shutdown() deleted this worker's RRefs with it."""
        return self._stopped

    def stop(self, join_threads=True):
        """Stops serving and completing; fails the futures still pending."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            pending, self._pending = self._pending, {}
        self.client.stop_events()
        if join_threads:
            current = threading.current_thread()
            for thread in self._threads:
                if thread is not current:
                    thread.join(timeout=10)
        for future, _, _ in pending.values():
            if not future.done():
                future.set_exception(RuntimeError(
                    "RPC agent was shut down before the call completed"))
        self.client.close()

    # --- workers ---

    def learn(self, group_view):
        with self._lock:
            for member in group_view.get("members", []):
                info = WorkerInfo(member["name"], int(member["rank"]))
                self._workers_by_name[info.name] = info
                self._workers_by_id[info.id] = info

    def refresh(self):
        self.learn(self.client.group(self.group))

    def worker_info(self, key):
        # Every call looks its callee up: the tables are read without the lock (one dict read
        # is atomic under the GIL; learn() writes them under the lock).
        table = self._workers_by_name if isinstance(key, str) else self._workers_by_id
        info = table.get(key)
        if info is None:
            self.refresh()  # a dynamic group's newer member
            info = table.get(key)
        if info is None:
            what = "name" if isinstance(key, str) else "id"
            raise RuntimeError(f"name:{self.info.name},rank:{self.info.id} could not find "
                               f"destination {what} {key}")
        return info

    def worker_infos(self):
        self.refresh()
        with self._lock:
            return sorted(self._workers_by_id.values(), key=lambda w: w.id)

    # torch's RpcAgent methods that programs and torch's tests call on
    # rpc.api._get_current_rpc_agent().
    def get_worker_info(self, worker_name=None):
        return self.info if worker_name is None else self.worker_info(worker_name)

    def get_worker_infos(self):
        return self.worker_infos()

    def get_debug_info(self):
        """torch's RpcAgent.get_debug_info, with the keys whose meaning tpd.rpc shares (strings,
        as torch's): the pool that runs requests, and this worker's calls awaiting replies."""
        with self._lock:
            in_flight = self._in_flight
        return {"agent.thread_pool_size": str(self.num_worker_threads),
                "agent.num_pending_requests": str(in_flight)}

    # --- calls out ---

    def timeout_seconds(self, timeout):
        """A call's timeout in seconds as torch reads it: UNSET (negative) or None is the
        agent's, 0 none."""
        # torch: a negative (UNSET) timeout is the agent's; 0 is none.
        return self.rpc_timeout if timeout is None or timeout < 0 else float(timeout)

    def wait_idle(self, timeout=None):
        """Waits until no call this worker made is in flight (graceful shutdown)."""
        with self._idle:
            self._idle_waiters += 1
            try:
                return self._idle.wait_for(lambda: self._in_flight == 0, timeout)
            finally:
                self._idle_waiters -= 1

    def _started(self):
        self.check_process()
        with self._lock:
            if self._stopped:
                raise RuntimeError("RPC agent is shut down")
            self._in_flight += 1

    def _ended(self):
        with self._lock:
            self._in_flight -= 1
            if self._in_flight == 0 and self._idle_waiters:
                self._idle.notify_all()

    def call_sync(self, to, message, timeout=None):
        seconds = self.timeout_seconds(timeout)
        payload, descriptors, keep = _pickler.dumps(message, to.name)
        self._started()
        try:
            event = self.client.call(self._group_bytes, to.name, _METHOD_BYTES, payload,
                                     descriptors, seconds)
        finally:
            self._ended()
        del keep  # the call completed: the daemon read what it had to
        return self._result(event, seconds)

    def call_async(self, to, message, timeout=None):
        seconds = self.timeout_seconds(timeout)
        payload, descriptors, keep = _pickler.dumps(message, to.name)
        future = torch.futures.Future()
        tag = next(self._tags)
        self._started()
        with self._lock:
            self._pending[tag] = (future, keep, seconds)
        try:
            self.client.call_async(self._group_bytes, to.name, _METHOD_BYTES, payload,
                                   descriptors, seconds, tag)
        except BaseException:
            with self._lock:
                self._pending.pop(tag, None)
            self._ended()
            raise
        return future

    def _result(self, event, timeout_s):
        """The value of a reply event, or the exception it stands for (raised)."""
        code, message, payload, num_tensors = event.read()
        if code == _client.DEADLINE_EXCEEDED:
            raise timeout_error(timeout_s)
        if code != _client.OK:
            raise RuntimeError(message)
        reply = _pickler.loads(payload, num_tensors, event)
        if reply[0]:
            return reply[1]
        raise_remote(reply[1], reply[2])

    def _events(self, queue):
        """The events of `queue`, until the client stops its events."""
        while True:
            try:
                yield self.client.next_event(queue)
            except _client.TpdError:
                return  # stopped

    def _reply_loop(self):
        for event in self._events(_client.QUEUE_REPLIES):
            if event.kind == _client.EVENT_RELEASED:
                with self._lock:
                    self._cuda_replies.pop(event.tag, None)  # their memory may change now
                continue
            with self._lock:
                entry = self._pending.pop(event.tag, None)
            if entry is None:
                continue  # failed already at shutdown
            self._ended()
            future, keep, timeout_s = entry
            del keep
            try:
                value = self._result(event, timeout_s)
            except Exception as exc:  # the call's error, handed to whoever waits
                future.set_exception(exc)
            else:
                future.set_result(value)
            finally:
                event.free()

    # --- calls in ---

    def _serve_loop(self):
        for event in self._events(_client.QUEUE_REQUESTS):
            try:
                self._serve(event)
            except Exception:  # never lose the thread: the request was answered or freed
                traceback.print_exc()

    def _serve(self, event):
        try:
            _, _, payload, num_tensors = event.read()
            message = _pickler.loads(payload, num_tensors, event)
        except Exception as exc:
            self._reply_exception(event, exc)
            return
        kind = message[0]
        if kind == CALL:
            self._run(event, message[1], message[2], message[3])
        elif kind == REMOTE:
            self._remote(event, *message[1:])
        elif kind == FETCH:
            self._fetch(event, message[1])
        elif kind == RREF_ADD:
            caller = event.caller
            self._answer_hold(event, caller, "fork", message[1],
                              self.fork(message[1], caller, message[2]))
        elif kind == RREF_DEL:
            caller = event.caller
            self._answer_hold(event, caller, "delete", message[1],
                              self.release(message[1], caller))
        else:
            self._reply_exception(event, ValueError(f"unknown tpd.rpc message kind {kind!r}"))

    def _invoke(self, func, args, kwargs):
        """Runs func: a torch Future for an @async_execution function, else its result as
        _Done."""
        try:
            result = func(*args, **(kwargs or {}))
        except TypeError as exc:
            # torch's agent runs a builtin operator by its schema, and arguments that match
            # none are its RuntimeError, in these words; Python's binding says TypeError.
            if torch.jit._builtins._find_builtin(func) is None:
                raise
            raise RuntimeError("Overloaded torch operator invoked from Python failed to many any "
                               f"schema:\n{exc}") from None
        if isinstance(result, AsyncResult):  # an @async_execution method behind an RRef proxy
            result = result.future
        elif getattr(func, "_wrapped_async_rpc_function", None) is None:
            return _Done(result)
        if not isinstance(result, torch._C.Future):  # then() gives the base class
            raise RuntimeError(
                "Functions decorated with @rpc.async_function must return a "
                f"torch.futures.Future object, but got {type(result)}")
        return result

    def _run(self, event, func, args, kwargs):
        try:
            result = self._invoke(func, args, kwargs)
        except Exception as exc:
            self._reply_exception(event, exc)
            return
        if isinstance(result, _Done):
            self._reply_value(event, result.value)
            return
        result.then(lambda done: self._reply_future(event, done))

    def _reply_future(self, event, done):
        try:
            value = done.wait()
        except Exception as exc:
            self._reply_exception(event, exc)
        else:
            self._reply_value(event, value)

    def _reply_value(self, event, value):
        try:
            payload, descriptors, keep = _pickler.dumps((True, value), lambda: event.caller)
        except Exception as exc:
            self._reply_exception(event, exc)
            return
        cuda = [t for t in keep if t.is_cuda]
        tag = 0
        if cuda:
            # The daemon copies them after the reply left: kept until it says it is done.
            tag = next(self._tags)
            with self._lock:
                self._cuda_replies[tag] = cuda
        self._send(event, payload, descriptors, release_tag=tag)

    def _reply_exception(self, event, exc):
        message = remote_exception_message(self.info, exc)
        print(message, file=sys.stderr)  # as torch's callee logs it
        self._reply_error(event, type(exc), message)

    def _reply_error(self, event, exc_type, message):
        try:
            payload, descriptors, _ = _pickler.dumps((False, exc_type, message))
        except Exception:  # an exception type that does not pickle
            payload, descriptors, _ = _pickler.dumps((False, RuntimeError, message))
        self._send(event, payload, descriptors)

    @staticmethod
    def _send(event, payload, descriptors, release_tag=0):
        try:
            event.reply(payload, descriptors, release_tag=release_tag)
        except _client.TpdError:
            pass  # the caller has its answer (the error) or is gone
        event.free()

    # --- RRefs this worker owns ---
    #
    # Only a worker that holds an RRef may fetch, fork or delete it: the owner counts, per
    # value, the RRef objects each worker holds, and refuses the others' messages, knowing
    # the caller from the daemon (which names the member a request came from), never from the
    # message. Ids are "<creator>#<n>": a remote() creates its value under one of its own.

    def new_rref_id(self):
        return f"{self.info.name}#{next(self._rref_ids)}"

    def own(self, rref_id, future, holder):
        """Registers a value this worker owns, its first RRef held by worker ``holder``; False
        when ``rref_id`` is taken."""
        with self._lock:
            if rref_id in self._owned:
                return False
            self._owned[rref_id] = _Owned(future, holder)
            return True

    def owned(self, rref_id):
        self.check_process()
        with self._lock:
            owned = self._owned.get(rref_id)
        if owned is None:
            raise RuntimeError(f"RRef {rref_id} is not owned by {self.info} (deleted?)")
        return owned

    def fork(self, rref_id, holder, receiver):
        """``holder`` passes its RRef on: one more for ``receiver``. False when ``holder``
        holds none."""
        self.check_process()
        with self._lock:
            owned = self._owned.get(rref_id)
            if owned is None or holder not in owned.holders:
                return False
            owned.holders[receiver] = owned.holders.get(receiver, 0) + 1
            return True

    def release(self, rref_id, holder):
        """One RRef of ``holder``'s went away; the value goes with the last. False when
        ``holder`` holds none."""
        with self._lock:
            owned = self._owned.get(rref_id)
            if owned is None or holder not in owned.holders:
                return False
            left = owned.holders[holder] - 1
            if left:
                owned.holders[holder] = left
            else:
                del owned.holders[holder]
                if not owned.holders:
                    del self._owned[rref_id]
            return True

    def _refuse(self, event, message):
        _log.debug("%s refused an RRef message: %s", self.info, message)
        self._reply_error(event, RuntimeError, message)

    def _not_held(self, caller, action, rref_id):
        return (f"worker {caller} holds no RRef {rref_id} owned by {self.info} (deleted?), "
                f"so may not {action} it")

    def _answer_hold(self, event, caller, action, rref_id, accepted):
        if accepted:
            self._reply_value(event, None)
        else:
            self._refuse(event, self._not_held(caller, action, rref_id))

    def _remote(self, event, rref_id, func, args, kwargs):
        caller = event.caller
        future = torch.futures.Future()
        if rref_id.rpartition("#")[0] != caller or not self.own(rref_id, future, caller):
            # Taking another's id, or one in use, would hand the caller others' value.
            self._refuse(event, f"worker {caller} may not create RRef {rref_id} on "
                                f"{self.info}: the id is another worker's, or in use")
            return
        try:
            result = self._invoke(func, args, kwargs)
        except Exception as exc:
            future.set_exception(self._remote_error(exc))
        else:
            if isinstance(result, _Done):
                future.set_result(result.value)
            else:
                def settle(done):
                    try:
                        future.set_result(done.wait())
                    except Exception as exc:
                        future.set_exception(self._remote_error(exc))
                result.then(settle)
        self._reply_value(event, None)

    def _fetch(self, event, rref_id):
        # Answered at once when the caller holds no RRef of rref_id; a value still being
        # computed (its remote() arrived, its function runs) is answered once there.
        caller = event.caller
        with self._lock:
            owned = self._owned.get(rref_id)
            if owned is not None and caller not in owned.holders:
                owned = None
        if owned is None:
            self._refuse(event, self._not_held(caller, "fetch", rref_id))
            return

        def answer(done):
            try:
                value = done.wait()
            except _RemoteError as exc:
                self._reply_error(event, exc.exc_type, exc.message)
            except Exception as exc:
                self._reply_exception(event, exc)
            else:
                self._reply_value(event, value)
        owned.future.then(answer)

    def _remote_error(self, exc):
        return _RemoteError(type(exc), remote_exception_message(self.info, exc))


class AsyncResult:
    """What a call through an RRef proxy returns when the method it ran is an
    @async_execution one: its Future, to be answered once done (the proxy's own function is
    not marked, the method is)."""

    __slots__ = ("future",)

    def __init__(self, future):
        self.future = future


class _Done:
    """A plain function's result (as opposed to an async_execution future)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class _RemoteError(Exception):
    """An exception raised where an RRef's value was computed, kept with torch's text."""

    def __init__(self, exc_type, message):
        super().__init__(message)
        self.exc_type = exc_type
        self.message = message

    def reraise(self):
        raise_remote(self.exc_type, self.message)
