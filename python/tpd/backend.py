"""torch.distributed.rpc itself on tpd: ``import tpd.backend`` registers the ``TPD`` backend.

    import torch.distributed.rpc as rpc
    import tpd.backend  # noqa: F401 (registers BackendType.TPD)

    rpc.init_rpc("worker0", rank=0, world_size=2, backend=rpc.BackendType.TPD,
                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions(init_method="env://"))

Everything torch builds above its agent then runs on the node's tpd daemon: RRefs, distributed
autograd, ``DistributedOptimizer``, ``RemoteModule``, TorchScript calls. The options are
torch's own ``TensorPipeRpcBackendOptions``; the job's rendezvous is tpd.rpc's (one group per
``init_rpc``, named and keyed from this user's secret, docs/python.md "Rendezvous"). The agent
is the C++ extension ``tpd._C`` (python/tpd/csrc), built against the installed torch.
"""

import atexit
import functools
import os

import torch.distributed.rpc as _rpc
from torch.distributed.rpc import backend_registry as _registry

from . import _client
from ._client import Client
from .rpc import api as _api

_METHOD = "torch.rpc"  # what the agent serves (python/tpd/csrc/agent.cc)


def _extension():
    """tpd._C, checked against this torch; ImportError naming what is missing."""
    try:
        from . import _C
    except ImportError as e:
        import torch
        raise ImportError(
            f"the TPD backend needs tpd's torch extension tpd._C, built against this torch "
            f"({torch.__version__}): {e}. Build it with `python3 python/tpd/csrc/build.py` "
            "(torch's C++ headers: Debian's libtorch-dev) or `pip install ./python`; tpd.rpc "
            "works without it") from None
    import torch
    # torch's C++ ABI changes between minor versions: 1.13.x and 2.11.x are different torches.
    if _C.TORCH_VERSION.split(".")[:2] != torch.__version__.split(".")[:2]:
        raise ImportError(f"tpd._C was built against torch {_C.TORCH_VERSION} but this is torch "
                          f"{torch.__version__}: rebuild it (python3 python/tpd/csrc/build.py)")
    return _C


def _construct_options(rpc_timeout, init_method, num_worker_threads=16, _transports=None,
                       _channels=None, **kwargs):
    return _rpc.TensorPipeRpcBackendOptions(
        rpc_timeout=rpc_timeout, init_method=init_method, num_worker_threads=num_worker_threads,
        _transports=_transports, _channels=_channels)


def _members(client, group):
    """What lists ``group``'s members now, [(name, rank)], through ``client``'s handle (which
    the agent owns from init on, and asks only while it runs): a dynamic group's agent asks it
    for workers that joined since."""
    read = _client.group_reader(client, group)

    def members():
        return [(m["name"], int(m.get("rank", 0))) for m in read().get("members", [])]
    return members


def _maps(negotiated):
    """{worker: {"cuda:0": "cuda:1"}} of a NegotiatedMember's maps (proto3 JSON)."""
    return {worker: dict(mapping.get("devices", {})) for worker, mapping in negotiated.items()}


def _leave_alone(name):
    """A dynamic group's worker leaves without waiting for the others, as in torch's own
    dynamic groups: torch's shutdown treats every agent but its TensorPipe one as static, and
    gathers every worker its init named (``_ALL_WORKER_NAMES``, this worker's view at its join,
    which differs between workers that joined at different times: the gather then waits for
    the wrong workers, or for ones already gone). Naming only this worker there makes that
    gather its own; the daemon tells the others it left."""
    _rpc.api._ALL_WORKER_NAMES = {name}


def _stop_at_exit():
    """A program that ends without ``rpc.shutdown()``: the agent's threads stop before the
    interpreter finalizes (TpdAgent::StopAtExit; a thread calling into a finalizing Python
    aborts the process)."""
    try:
        agent = _rpc.api._get_current_rpc_agent()
    except RuntimeError:  # RPC not initialized, or shut down
        return
    if isinstance(agent, _extension().TpdAgent):
        agent._stop_at_exit()


def _init_backend(store, name, rank, world_size, rpc_backend_options):
    """torch's init_rpc calls this with its rendezvous store (under this init's prefix): the
    job joins a tpd group, and torch starts the agent returned."""
    options = rpc_backend_options
    if not isinstance(options, _rpc.TensorPipeRpcBackendOptions):
        raise TypeError(f"`rpc_backend_options` must be a `TensorPipeRpcBackendOptions`. {options}")
    if _client.forked_from() is not None:
        # tpd._C finds the library by its path, i.e. the parent's copy, not this child's.
        raise RuntimeError(
            f"backend=TPD cannot start in a process forked from process {_client.forked_from()} "
            "after tpd's client library was loaded there: start it with multiprocessing's "
            "'spawn' or 'forkserver' start method, or exec it (tpd.rpc can init in a forked child)")
    # CUDA tensors sent to this worker land in a receive pool on each of its devices
    # (docs/python.md, "Tensors, memory and arena_bytes").
    client = Client(os.environ.get("TPD_SOCKET", ""),
                    cuda_pool_bytes=int(os.environ.get("TPD_CUDA_POOL_BYTES", "0")))
    try:
        group, init_method, secret = _api._rendezvous(client, options, store)
        response = _api._join_group(client, name, rank, world_size, options, group, init_method,
                                    secret, store, _METHOD)
        workers = _members(client, group)()
        negotiated = response.get("negotiated", {})
        agent = _extension().TpdAgent(
            library=_client.library_path(), client=client._handle.value, group=group, name=name,
            rank=int(response.get("rank", rank)), is_static=bool(world_size), workers=workers,
            num_worker_threads=int(options.num_worker_threads),
            rpc_timeout_seconds=float(options.rpc_timeout),
            arena_bytes=int(client.call_stats().get("arena_bytes", 0)),
            members=None if world_size else _members(client, group),
            started=None if world_size else functools.partial(_leave_alone, name),
            devices=list(negotiated.get("devices", [])),
            device_maps=_maps(negotiated.get("device_maps", {})),
            reverse_device_maps=_maps(negotiated.get("reverse_device_maps", {})))
    except BaseException:
        client.close()
        raise
    client.detach()  # the agent owns the client now, and closes it at shutdown
    return agent


_extension()  # at import: a program without it learns so before init_rpc
atexit.register(_stop_at_exit)
if "TPD" not in _registry.BackendType.__members__:
    _registry.register_backend("TPD", _construct_options, _init_backend)
    # register_backend makes a new BackendType enum in the registry; torch.distributed.rpc's
    # name for it is the old one, which init_rpc's isinstance check would refuse.
    _rpc.BackendType = _registry.BackendType
