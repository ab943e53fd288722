"""tpd.rpc: torch.distributed.rpc on the node's tpd daemon.

    import tpd.rpc as rpc          # was: import torch.distributed.rpc as rpc

Same functions, options, exceptions and messages; calls go through the daemon (shared memory
on one node, the daemons' TensorPipe pipes across nodes). See docs/python.md.
"""

from tpd.rpc import functions  # noqa: F401
from tpd.rpc.arena import empty, in_flight, shared_like  # noqa: F401
from tpd.rpc.api import (  # noqa: F401
    BackendType,
    RpcBackendOptions,
    TensorPipeRpcBackendOptions,
    WorkerInfo,
    _get_current_rpc_agent,
    _is_current_rpc_agent_set,
    _set_rpc_timeout,
    _to_worker_info,
    _wait_all,
    _wait_all_workers,
    get_rpc_timeout,
    get_worker_info,
    group_store,
    init_rpc,
    remote,
    rpc_async,
    rpc_sync,
    shutdown,
)
from tpd.rpc.constants import UNSET_RPC_TIMEOUT  # noqa: F401
from tpd.rpc.rref import RRef  # noqa: F401


def is_available() -> bool:
    """Whether RPC is available: always, as torch's ``is_available`` in a build with it."""
    return True
