"""torch.distributed.rpc.constants on tpd: the same values, so timeouts passed by name mean
the same thing."""

from torch.distributed.rpc.constants import (  # noqa: F401
    DEFAULT_INIT_METHOD,
    DEFAULT_NUM_WORKER_THREADS,
    DEFAULT_RPC_TIMEOUT_SEC,
    UNSET_RPC_TIMEOUT,
)
