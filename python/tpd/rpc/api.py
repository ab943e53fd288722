"""torch.distributed.rpc's public API on tpd (see docs/python.md).

Rendezvous. ``init_method`` keeps torch's meaning: ``env://`` (MASTER_ADDR, MASTER_PORT),
``tcp://host:port`` and ``file://path`` name a torch store, made by torch's own
``dist.rendezvous`` with torch's errors. tpd uses it once, for a public nonce that makes each
init_rpc's group its own; the group's name and secret are derived from ``TPD_RPC_SECRET`` or
this user's secret (``Client.user_secret``), and its home is the job's configuration
(``TPD_RPC_HOME``, or the rendezvous host's daemon). ``etcd://...`` and ``tpd://host:port``
(a daemon's peer port) skip torch's store and join directly, and need ``TPD_RPC_SECRET``.
"""

import atexit
import contextlib
import hashlib
import hmac
import logging
import numbers
import os
import secrets
import threading
import urllib.parse
from typing import Any, Callable, Dict, Iterator, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch._C._distributed_rpc import WorkerInfo
from torch.distributed.rpc import BackendType, RpcBackendOptions, backend_registry
from torch.distributed.rpc import TensorPipeRpcBackendOptions as _TorchOptions
from torch.distributed.rpc.constants import UNSET_RPC_TIMEOUT

from tpd import _client
from tpd._client import Client
from tpd.rpc import _agent, _state, rref
from tpd.rpc.options import TensorPipeRpcBackendOptions

__all__ = [
    "init_rpc", "shutdown", "rpc_sync", "rpc_async", "remote", "get_worker_info",
    "WorkerInfo", "BackendType", "RpcBackendOptions", "TensorPipeRpcBackendOptions",
    "get_rpc_timeout", "group_store",
]

_init_counter = 0     # as torch: each init_rpc uses a store prefix of its own
_log = logging.getLogger(__name__)


_require_initialized = _state.require_initialized


def _is_current_rpc_agent_set() -> bool:
    return _state.current is not None


_thread_local_var = threading.local()  # future_list while in _wait_all()


@contextlib.contextmanager
def _wait_all() -> Iterator[None]:
    """Collects the futures of rpc_async calls made in the block and waits for them at its end
    (torch's private helper)."""
    _thread_local_var.future_list = []
    try:
        yield
    finally:
        try:
            torch.futures.wait_all(_thread_local_var.future_list)
        finally:
            del _thread_local_var.future_list


def _is_backend_type(backend: Any) -> bool:
    """Whether ``backend`` is a member of torch's BackendType. Registering a backend (``import
    tpd.backend`` registers TPD) makes the registry a new enum, while names bound before (this
    module's, torch's own tests') keep the old one: members of either count."""
    current = backend_registry.BackendType
    return isinstance(backend, (current, BackendType)) and backend.name in current.__members__


def init_rpc(name: str, backend: Optional[BackendType] = None, rank: int = -1,
             world_size: Optional[int] = None,
             rpc_backend_options: Optional[RpcBackendOptions] = None) -> None:
    """Joins this process to the job's tpd group as worker ``name``: torch's ``init_rpc``.

    Args:
        name (str): this worker's name, unique in the job.
        backend (BackendType, optional): ``BackendType.TENSORPIPE`` or None; tpd.rpc runs
            that one (``backend=BackendType.TPD`` is torch's own RPC on tpd: ``tpd.backend``).
        rank (int): this worker's rank, in ``[0, world_size)``; -1 with a dynamic group.
        world_size (int, optional): the job's number of workers; None for a dynamic group,
            which workers join and leave at any time.
        rpc_backend_options (TensorPipeRpcBackendOptions, optional): torch's options (init
            method, timeout, threads, device maps, devices).

    Raises:
        TypeError: ``backend`` or ``rpc_backend_options`` of the wrong type (torch's words).
        ValueError: a backend tpd.rpc does not run.
        RuntimeError: RPC already initialized in this process, a bad rendezvous, a name taken
            or a device map the daemon refuses, each in torch's words where torch has them.
    """
    global _init_counter
    if backend is not None and not _is_backend_type(backend):
        raise TypeError("Argument backend must be a member of BackendType")
    if rpc_backend_options is not None and not isinstance(rpc_backend_options,
                                                          RpcBackendOptions):
        raise TypeError("Argument rpc_backend_options must be an instance of RpcBackendOptions")
    if backend is not None and backend.name != "TENSORPIPE":
        raise ValueError(f"tpd.rpc runs the TENSORPIPE backend only, not {backend}")
    if rpc_backend_options is not None and not isinstance(rpc_backend_options, _TorchOptions):
        # torch's words: with no backend it infers one from the options' type, and the
        # TENSORPIPE backend takes only its own options.
        if backend is None:
            raise TypeError(f"Could not infer backend for options {rpc_backend_options}")
        raise TypeError("`rpc_backend_options` must be a `TensorPipeRpcBackendOptions`. "
                        f"{rpc_backend_options}")
    options = rpc_backend_options or TensorPipeRpcBackendOptions()
    for arg, kind in ((name, str), (rank, numbers.Integral),
                      (world_size, (numbers.Integral, type(None)))):
        if not isinstance(arg, kind):
            raise RuntimeError(f"Argument {arg} must be of type {kind} but got type {type(arg)}")
    if world_size is None and "WORLD_SIZE" in os.environ and options.init_method == "env://":
        world_size = int(os.environ["WORLD_SIZE"])
    with _state.lock:
        if _state.current is not None:
            raise RuntimeError("RPC is already initialized")
        prefix = f"tpd_rpc_{_init_counter}"
        _init_counter += 1
    # torch's store first: rank 0 listens sooner, so the other ranks' first dial finds it
    # (a dial refused costs torch's client a 1 s retry), and a rank whose daemon cannot be
    # reached can still tell the job (_abandon).
    store = _torch_store(options, rank, world_size, prefix)
    # The receive pool lent on each CUDA device a worker gets: CUDA tensors sent to it land
    # there (docs/python.md, "Tensors, memory and arena_bytes").
    try:
        client = Client(os.environ.get("TPD_SOCKET", ""),
                        cuda_pool_bytes=int(os.environ.get("TPD_CUDA_POOL_BYTES", "0")))
    except _client.TpdError as e:
        _tell_store(store, rank, name, world_size, f"cannot reach its tpd daemon: {e}")
        raise
    try:
        group, init_method, secret = _rendezvous(client, options, store)
        agent = _join(client, name, rank, world_size, options, group, init_method, secret,
                      store)
    except BaseException:
        client.close()
        raise
    with _state.lock:
        _state.current = agent
    # Requests that arrived since the join waited in the library's queue; their handlers may
    # call rpc_* now that the agent is current.
    agent.start()


def _torch_store(options, rank, world_size, prefix):
    """The job's torch store under this init_rpc's prefix (torch's own rendezvous, with torch's
    errors), or None for etcd:// and tpd://, which skip it."""
    if options.init_method.startswith(("etcd://", "tpd://")):
        return None
    if world_size:
        store, _, _ = next(dist.rendezvous(options.init_method, rank=rank,
                                           world_size=world_size))
    else:
        store = dist._create_store_from_options(options, rank)
    return dist.PrefixStore(prefix, store)


def _rendezvous(client, options, store):
    """(group, tpd init method, secret) of this job.

    Nothing that decides who may join comes from a store others can write (docs/security.md,
    "Python jobs"): the group's home is the job's own configuration (``_home``), and its secret
    is ``TPD_RPC_SECRET`` or derived from this user's secret, which only this uid's sessions
    get from their daemons. torch's store carries one public nonce, so each init_rpc gets a
    group of its own."""
    url = options.init_method
    secret = os.environ.get("TPD_RPC_SECRET", "")
    if url.startswith(("etcd://", "tpd://")):
        home = url if url.startswith("etcd://") else "tcp://" + url[len("tpd://"):]
        if secret:
            return _derive_group(secret, ""), home, secret
        if os.environ.get("TPD_RPC_OPEN_GROUP") == "1":
            return os.environ.get("TPD_RPC_GROUP", "rpc"), home, ""
        raise RuntimeError(
            f"init_method {url.split('://')[0]}:// needs the job's secret: set TPD_RPC_SECRET "
            "to the same random value in every worker of the job (for example "
            "`python3 -c 'import secrets; print(secrets.token_hex(16))'`); without one any "
            "user of any node could join the job and run code in its workers. "
            "TPD_RPC_OPEN_GROUP=1 allows such an open group on purpose")
    home = _home(client, url)
    # The first nonce stored wins (c10d compare_set). Whoever writes it first picks only a
    # number: without this user's secret it cannot tell which group that makes.
    nonce = store.compare_set("tpd/nonce", "", secrets.token_hex(16))
    if isinstance(nonce, bytes):
        nonce = nonce.decode("utf-8")
    if not secret:
        secret = client.user_secret("tpd.rpc job secret").hex()
    job_secret = hmac.new(secret.encode(), b"tpd.rpc secret " + nonce.encode(),
                          hashlib.sha256).hexdigest()
    return _derive_group(secret, nonce), home, job_secret


def _derive_group(secret, nonce):
    """The job's group name: derived from its secret (and the store's nonce), so nobody without
    the secret can name it in advance to squat it."""
    key = secret.encode()
    return "rpc-" + hmac.new(key, b"tpd.rpc group " + nonce.encode(),
                             hashlib.sha256).hexdigest()[:24]


def _home(client, url):
    """Where the job's group lives: ``TPD_RPC_HOME`` (``tcp://host:port`` of a tpd peer port,
    or ``etcd://...``), else the daemon on the rendezvous host (``MASTER_ADDR``, or the
    ``tcp://`` URL's host) at this daemon's own peer port, as every daemon of a cluster has
    the same one. Never an address from torch's store, which anyone who reaches it can
    write."""
    home = os.environ.get("TPD_RPC_HOME", "")
    if home:
        if home.startswith("tpd://"):
            home = "tcp://" + home[len("tpd://"):]
        if not home.startswith(("tcp://", "etcd://")):
            raise ValueError(f"TPD_RPC_HOME must be tcp://host:port (a tpd daemon's peer port) "
                             f"or etcd://..., not {home!r}")
        return home
    peer = client.status().get("peer_address", "")
    if not peer:
        raise RuntimeError(
            "the tpd daemon has no peer port ([peer] listen_address), which the job's group "
            "lives behind: configure one, or set TPD_RPC_HOME to an etcd:// URL")
    port = peer.rsplit(":", 1)[1]
    if url.startswith("env://"):
        host = os.environ.get("MASTER_ADDR", "")
    elif url.startswith("tcp://"):
        host = urllib.parse.urlsplit(url).hostname or ""
    else:
        host = ""
    if not host:
        raise RuntimeError(
            f"init_method {url!r} names no host whose daemon could hold the job's group: set "
            "TPD_RPC_HOME=tcp://host:port (a tpd daemon's peer port every worker reaches) or "
            "an etcd:// URL")
    if ":" in host:
        host = f"[{host}]"
    return f"tcp://{host}:{port}"


def _join(client, name, rank, world_size, options, group, init_method, secret, store):
    response = _join_group(client, name, rank, world_size, options, group, init_method, secret,
                           store, _agent.METHOD)
    info = WorkerInfo(name, int(response.get("rank", 0)))
    agent = _agent.Agent(client, group, info, options, world_size, store)
    agent.learn(response.get("group", {}))
    return agent


def _join_group(client, name, rank, world_size, options, group, init_method, secret, store,
                method):
    """Joins `client` to the job's group as worker `name`, serving `method`, and returns the
    join's response once every rank of a static group has joined (tpd's barrier). Shared by
    tpd.rpc and the TPD backend (tpd.backend), with torch's errors: ValueError for options
    torch refuses, RuntimeError for anything else; a static rank that cannot take part tells
    the others at once."""
    join = {
        "group": group,
        "name": name,
        "init_method": init_method,
        "secret": secret,
        "num_worker_threads": int(options.num_worker_threads),
        "rpc_timeout": float(options.rpc_timeout),
        "timeout": max(float(options.rpc_timeout), 60.0),
        "device": [str(torch.device(d)) for d in (options.devices or [])],
        "transport": getattr(options, "_tpd_transports", []),
        "channel": getattr(options, "_tpd_channels", []),
    }
    if world_size:
        join["world_size"] = int(world_size)
    if rank is not None and rank >= 0:
        join["rank"] = int(rank)
    # add(key, 0) reads a counter without waiting (torch 1.13's PrefixStore has no check()).
    if store is not None and store.add(_FAILED_COUNT_KEY, 0) > 0:
        # A rank that could not take part said so before this one came (see _abandon).
        raise RuntimeError(_decode(store.get(_FAILED_KEY)))
    if store is not None and _mixes_kinds(store, bool(world_size)):
        _abandon(client, join, store, _MIXED)
        raise RuntimeError(_MIXED)
    # Serving before joining: a peer may call this worker the moment the group forms.
    try:
        client.serve(method)
    except _client.TpdError as e:
        _abandon(client, join, store, str(e))
        raise RuntimeError(str(e)) from None
    device_maps = {
        worker: {_device(src): _device(dst) for src, dst in mapping.items()}
        for worker, mapping in (options.device_maps or {}).items()
    }
    try:
        response = client.join(join, device_maps)
    except _client.TpdError as e:
        # Options that fail validation (device maps, devices, transports) are torch's
        # ValueErrors, with its words; anything else a RuntimeError. The daemon failed the
        # group for a join it refused, so the other ranks know already.
        if e.code == _client.INVALID_ARGUMENT:
            raise ValueError(str(e)) from None
        raise RuntimeError(str(e)) from None
    if world_size:
        # Join returns once the group formed, and each worker then lends the daemon its CUDA
        # receive pools: a barrier makes sure every worker has, before any may call another
        # (as torch's init_rpc syncs its workers before returning).
        try:
            client.barrier(group, name, float(options.rpc_timeout) or None)
        except _client.TpdError as e:
            raise RuntimeError(str(e)) from None
    return response


_FAILED_KEY = "tpd/failed"
_FAILED_COUNT_KEY = "tpd/failed/count"


_STATIC_COUNT_KEY = "tpd/static/count"
_DYNAMIC_COUNT_KEY = "tpd/dynamic/count"
_MIXED = ("RPC group mixes statically and dynamically initialized members which is not "
          "supported.")


def _mixes_kinds(store, is_static):
    """Whether workers of the other kind (static: world_size given; dynamic: none) came to this
    job's torch store. torch refuses such a job through its store, which outlives the workers:
    a dynamic worker coming after the static ones have gone is refused too (the daemon refuses
    only the mix of members present). Each worker counts its kind, then reads the other's: of
    two that race, the later one sees the earlier."""
    mine, other = ((_STATIC_COUNT_KEY, _DYNAMIC_COUNT_KEY) if is_static
                   else (_DYNAMIC_COUNT_KEY, _STATIC_COUNT_KEY))
    store.add(mine, 1)
    return store.add(other, 0) > 0


def _decode(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _abandon(client, join, store, reason):
    """Tells the job that this rank cannot take part, and why, so the other ranks raise at once
    instead of waiting for it: through the group (a static join's ``abandon``: the group fails
    naming this rank) and through torch's store for ranks that have not joined yet. Best effort:
    this rank raises its own error whatever happens here."""
    if not join.get("world_size"):
        return  # a dynamic group waits for nobody
    _tell_store(store, join.get("rank", "?"), join["name"], join["world_size"], reason)
    with contextlib.suppress(_client.TpdError):
        client.join(dict(join, abandon=reason[:1000], timeout=10.0))


def _tell_store(store, rank, name, world_size, reason):
    """Writes this rank's failure into the job's torch store, where ranks that have not
    joined yet find it (_join). Best effort; static jobs only."""
    if store is None or not world_size:
        return
    with contextlib.suppress(Exception):
        store.set(_FAILED_KEY, f"rank {rank} ({name}) cannot take part: {reason} (said through "
                               "the job's rendezvous store)")
        store.add(_FAILED_COUNT_KEY, 1)


def _device(device):
    return str(torch.device(device)) if not isinstance(device, int) else f"cuda:{device}"


def shutdown(graceful: bool = True, timeout: float = 0) -> None:
    """Stops this worker: torch's ``shutdown``.

    Graceful, as torch: waits for the calls this worker made, then until every worker of a
    static group got there too (tpd's barrier: after it nobody calls anyone), then leaves
    (tpd's Leave drains the calls still being served). Otherwise it leaves at once.

    Args:
        graceful (bool): wait for the job as above, or leave at once.
        timeout (float): at most this many seconds for the graceful wait (0: no limit).

    Raises:
        RuntimeError: the daemon failed the leave or the barrier (naming why), or this is a
            forked child of the process that called ``init_rpc``.
    """
    with _state.lock:
        agent = _state.current
    if agent is None:
        if _state.forked_from is not None:
            raise _state.forked_error(_state.forked_from)
        return
    try:
        if graceful:
            wait = timeout if timeout and timeout > 0 else None
            agent.wait_idle(wait)
            if agent.world_size:
                # Workers that died or left count as arrived: the live ones go on at once.
                gone = agent.client.barrier(agent.group, agent.info.name, wait)
                if gone:
                    _log.warning("RPC shutdown of %s: %s had left or died before it; not "
                                 "waited for", agent.info.name, ", ".join(gone))
            agent.client.leave(agent.group, agent.info.name)
    except _client.TpdError as e:
        raise RuntimeError(f"RPC shutdown failed: {e}") from None
    finally:
        with _state.lock:
            _state.current = None
        agent.stop()


@atexit.register
def _shutdown_at_exit():
    # A program that forgot shutdown() exits cleanly: its members leave at once. Only the
    # process that called init_rpc: a forked child's exit leaves the parent's membership alone
    # (the fork hooks forget the agent there, and a child forked by C code, without them, has
    # another pid).
    agent = _state.current
    if agent is None or agent.pid != os.getpid():
        return
    _state.current = None
    agent.stop(join_threads=False)


def get_worker_info(worker_name: Optional[str] = None) -> WorkerInfo:
    """The ``WorkerInfo`` (name and id) of worker ``worker_name``, or this worker's.

    Raises:
        RuntimeError: RPC not initialized, or no worker of that name in the group (torch's
            words).
    """
    agent = _require_initialized()
    if worker_name is None:
        return agent.info
    return agent.worker_info(worker_name)


def _get_current_rpc_agent() -> "_agent.Agent":
    return _require_initialized()


def group_store(namespace: str = "", timeout: Optional[float] = None) -> "dist.Store":
    """The job's store: a ``torch.distributed.Store`` (a ``tpd.Store``) that every worker of
    this job sees, on every node, kept in its rendezvous store and reached through this
    worker's daemon. Only the job's workers can use it. tpd's own: torch.distributed.rpc has
    no such call.

    Args:
        namespace (str): keys under it stay apart from other namespaces'.
        timeout (float, optional): the store's wait timeout in seconds (None: the default).

    Raises:
        RuntimeError: RPC not initialized.
    """
    from tpd._store import Store, _DEFAULT_TIMEOUT

    agent = _require_initialized()
    return Store(timeout=timeout or _DEFAULT_TIMEOUT,
                 _store=agent.client.store(group=agent.group, namespace=namespace))


def _to_worker_info(to: Union[str, int, WorkerInfo]) -> WorkerInfo:
    if isinstance(to, WorkerInfo):
        return to
    if isinstance(to, (str, int)):
        return _require_initialized().worker_info(to)
    raise ValueError("Cannot get WorkerInfo from name {}".format(to))


def get_rpc_timeout() -> float:
    """The default timeout of this worker's calls, in seconds (``rpc_timeout`` of its
    options, or what ``_set_rpc_timeout`` set).

    Raises:
        RuntimeError: RPC not initialized.
    """
    return _require_initialized().rpc_timeout


def _set_rpc_timeout(rpc_timeout: float) -> None:
    _require_initialized().rpc_timeout = float(rpc_timeout)


def _check_callable(func: Any) -> None:
    if not callable(func):
        raise TypeError("function should be callable.")


def rpc_sync(to: Union[str, int, WorkerInfo], func: Callable[..., Any],
             args: Optional[Tuple[Any, ...]] = None, kwargs: Optional[Dict[str, Any]] = None,
             timeout: float = UNSET_RPC_TIMEOUT) -> Any:
    """Runs ``func(*args, **kwargs)`` on worker ``to`` and returns its value: torch's
    ``rpc_sync``. Tensors go through the daemon (shared memory on one node, TensorPipe
    across nodes), CUDA tensors by the group's device maps.

    Args:
        to (str or int or WorkerInfo): the callee: a worker's name, id or ``WorkerInfo``.
        func (Callable): a function, builtin or TorchScript function the callee can import
            by name (it is pickled by reference, as torch pickles it).
        args (tuple, optional): its positional arguments.
        kwargs (dict, optional): its keyword arguments.
        timeout (float): seconds before the call fails with torch's timeout error; 0 means
            none; the default is ``get_rpc_timeout()``.

    Returns:
        What ``func`` returned (its tensors on the devices the maps say).

    Raises:
        Whatever ``func`` raised on the callee, re-raised here with its type and message.
        RuntimeError: RPC not initialized, no such worker, the callee failed or left, or the
            call timed out (torch's words: "RPC ran for more than ...").
        TypeError: ``func`` not callable, or an argument that cannot be sent over RPC.
        ValueError: ``to`` names no worker.
    """
    agent = _require_initialized()
    _check_callable(func)
    info = _to_worker_info(to)
    return agent.call_sync(info, (_agent.CALL, func, tuple(args or ()), dict(kwargs or {})),
                           timeout)


def rpc_async(to: Union[str, int, WorkerInfo], func: Callable[..., Any],
              args: Optional[Tuple[Any, ...]] = None, kwargs: Optional[Dict[str, Any]] = None,
              timeout: float = UNSET_RPC_TIMEOUT) -> torch.futures.Future:
    """Starts ``func(*args, **kwargs)`` on worker ``to``: torch's ``rpc_async``.

    Args:
        to (str or int or WorkerInfo): the callee: a worker's name, id or ``WorkerInfo``.
        func (Callable): a function, builtin or TorchScript function the callee can import
            by name (it is pickled by reference, as torch pickles it).
        args (tuple, optional): its positional arguments.
        kwargs (dict, optional): its keyword arguments.
        timeout (float): seconds before the call fails with torch's timeout error; 0 means
            none; the default is ``get_rpc_timeout()``.

    Returns:
        A ``torch.futures.Future`` of ``func``'s value; ``wait()`` raises what ``func`` raised,
        or the call's failure (timeout, callee gone) in torch's words.

    Raises:
        RuntimeError: RPC not initialized, no such worker, the callee failed or left, or the
            call timed out (torch's words: "RPC ran for more than ...").
        TypeError: ``func`` not callable, or an argument that cannot be sent over RPC.
        ValueError: ``to`` names no worker.
    """
    agent = _require_initialized()
    _check_callable(func)
    info = _to_worker_info(to)
    future = agent.call_async(info, (_agent.CALL, func, tuple(args or ()), dict(kwargs or {})),
                              timeout)
    if hasattr(_thread_local_var, "future_list"):
        _thread_local_var.future_list.append(future)
    return future


def remote(to: Union[str, int, WorkerInfo], func: Callable[..., Any],
           args: Optional[Tuple[Any, ...]] = None, kwargs: Optional[Dict[str, Any]] = None,
           timeout: float = UNSET_RPC_TIMEOUT) -> "rref.RRef":
    """Runs ``func(*args, **kwargs)`` on worker ``to`` and keeps its value there: torch's
    ``remote``.

    Args:
        to (str or int or WorkerInfo): the callee: a worker's name, id or ``WorkerInfo``.
        func (Callable): a function, builtin or TorchScript function the callee can import
            by name (it is pickled by reference, as torch pickles it).
        args (tuple, optional): its positional arguments.
        kwargs (dict, optional): its keyword arguments.
        timeout (float): seconds before the call fails with torch's timeout error; 0 means
            none; the default is ``get_rpc_timeout()``.

    Returns:
        An ``RRef`` to the value, owned by ``to``; ``to_here()`` fetches it, and raises what
        ``func`` raised or torch's timeout error when its creation took longer than
        ``timeout``.

    Raises:
        RuntimeError: RPC not initialized, no such worker, the callee failed or left, or the
            call timed out (torch's words: "RPC ran for more than ...").
        TypeError: ``func`` not callable, or an argument that cannot be sent over RPC.
        ValueError: ``to`` names no worker.
    """
    agent = _require_initialized()
    _check_callable(func)
    return rref.create_remote(agent, _to_worker_info(to), func, args or (), kwargs or {},
                              timeout)


def _wait_all_workers(timeout: Optional[float] = None) -> None:
    agent = _require_initialized()
    agent.client.barrier(agent.group, agent.info.name, timeout)
