"""PyTorch's own generic RPC test suites (torch/testing/_internal/distributed/rpc_utils.py,
GENERIC_TESTS) run with backend=TPD: torch.distributed.rpc itself, its agent tpd's (tpd._C),
through an RpcAgentTestFixture for TPD, the way torch runs them for its TensorPipe agent. The
tests, their fixtures (dist_init) and their assertions are torch's own, unchanged; each rank
is a process of its own, all on one tpd daemon this module starts.

    python3 -m pytest tests/python/test_torch_backend.py              # CI's cases
    TPD_TORCH_SUITES=all python3 -m pytest tests/python/test_torch_backend.py   # every case

torch's cases of dynamic groups (TpdDynamicRpcTest) come from its TensorPipe agent's suite,
where torch keeps them; they run in CI too.

CI runs the cases listed per suite below, chosen to cover each suite within CI's time budget
(a case costs ~1-2 s here: its ranks are processes, forked from a server that has imported
torch, rank_processes.py). docs/python.md lists
the counts of a run of every case and names each case that does not pass, with the reason.
"""

import os
import sys

import pytest

# torch's test helpers import `expecttest`, which Debian does not package: a stand-in.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "shims"))

import torch  # noqa: E402
import torch.distributed.rpc as rpc  # noqa: E402
from torch.testing._internal.common_distributed import MultiProcessTestCase  # noqa: E402
from torch.testing._internal.distributed.rpc.rpc_agent_test_fixture import (  # noqa: E402
    RpcAgentTestFixture,
)
from torch.testing._internal.distributed.rpc.rpc_test import (  # noqa: E402
    TensorPipeAgentCudaRpcTest,
    TensorPipeAgentRpcTest,
)
from torch.testing._internal.distributed.rpc_utils import (  # noqa: E402
    GENERIC_CUDA_TESTS,
    GENERIC_TESTS,
)

import tpd.backend  # noqa: E402,F401 (registers BackendType.TPD)
from torch_harness import OnTpd, keep_only  # noqa: E402


class TpdBackendFixture(RpcAgentTestFixture):
    """torch's fixture for an agent, for TPD: its backend, options and error words."""

    @property
    def rpc_backend(self):
        return rpc.backend_registry.BackendType["TPD"]

    @property
    def rpc_backend_options(self):
        return rpc.backend_registry.construct_rpc_backend_options(
            self.rpc_backend, init_method=self.init_method)

    def get_shutdown_error_regex(self):
        # As torch's TensorPipe fixture: shutdown errors differ by where the call was.
        return ".*"

    def get_timeout_error_regex(self):
        return "RPC ran for more than"


# The cases CI runs, per suite (TPD_TORCH_SUITES=all runs every case of every suite).
CI = {
    "RpcTest": [
        "test_worker_id",
        "test_send_to_rank",
        "test_disable_gil_profiling",
        "test_self_add",
        "test_add",
        "test_multi_rpc",
        "test_py_user_defined",
        "test_py_raise_in_user_func",
        "test_rpc_timeouts",
        "test_async_function_simple",
        "test_rref_forward_chain",
        "test_wait_all_exit_early_python",
        "test_local_shutdown",
    ],
    "ParameterServerTest": ["test_batch_updating_parameter_server"],
    "DistAutogradTest": [
        "test_backward_simple",
        "test_backward_multiple_round_trips",
        "test_backward_rref",
        "test_error_in_context",
    ],
    "DistOptimizerTest": ["test_dist_optim"],
    "JitRpcTest": ["test_torchscript_function", "test_remote_script_module"],
    "JitDistAutogradTest": ["test_get_gradients"],
    "RemoteModuleTest": ["test_forward_sync", "test_remote_parameters"],
    "ThreeWorkersRemoteModuleTest": ["test_send_remote_module_over_the_wire"],
    # DdpUnderDistAutogradTest and DdpComparisonTest: none here. Debian's torch 1.13 cannot
    # build DistributedDataParallel under Python 3.11 (its torch.distributed._shard has a
    # dataclass default Python 3.11 refuses), whatever the RPC backend; they run on the GPU
    # machine's torch 2.11 (docs/python.md).
    "ReinforcementLearningRpcTest": ["test_rl_rpc"],
}

_ALL = os.environ.get("TPD_TORCH_SUITES") == "all"

for _suite in GENERIC_TESTS:
    _name = f"Tpd{_suite.__name__}"
    _class = type(_name, (OnTpd, _suite, TpdBackendFixture, MultiProcessTestCase),
                  {"__doc__": f"torch's {_suite.__name__}, with backend=TPD."})
    _class.__module__ = __name__  # the ranks' processes find it by this module's name
    if not _ALL:
        keep_only(_class, _suite, CI.get(_suite.__name__, []))
    globals()[_name] = _class
del _suite, _name, _class  # not test classes themselves

# torch's cases of dynamic groups (world_size=None) live among its TensorPipe agent's own; they
# are written for any agent, so they run here too (all of them, in CI as well).
DYNAMIC = [
    "test_dynamic_rpc_init_rpc",
    "test_dynamic_rpc_new_rank_can_communicated_with_existing_rank",
    "test_dynamic_rpc_existing_rank_can_communicate_with_new_rank",
    "test_dynamic_rpc_init_rpc_without_rank",
    "test_dynamic_and_static_init_rpc_together",
]


class TpdDynamicRpcTest(OnTpd, TensorPipeAgentRpcTest, TpdBackendFixture, MultiProcessTestCase):
    """torch's cases of dynamic groups, with backend=TPD."""


keep_only(TpdDynamicRpcTest, TensorPipeAgentRpcTest, DYNAMIC)


# CUDA: torch's GENERIC_CUDA_TESTS, and the CUDA cases of its TensorPipe agent's suite (device
# maps, streams, CUDA futures and RRefs: written for any agent with device maps), on machines
# with a GPU (torch's skip_if_lt_x_gpu skips a case that needs more than there are). Without
# one they are not collected at all (each case would still spawn its ranks to skip):
# test_cuda_suites_need_a_gpu says so. docs/python.md has the GPU machine's counts.
if torch.cuda.is_available():
    # CUDA tensors a worker receives land in a receive pool per device (256 MiB by default);
    # torch's cases keep several 160 MB tensors received at once (test_owner_rref_forward_*).
    os.environ.setdefault("TPD_CUDA_POOL_BYTES", str(1 << 30))
    for _suite in GENERIC_CUDA_TESTS:
        _name = f"Tpd{_suite.__name__}"
        _class = type(_name, (OnTpd, _suite, TpdBackendFixture, MultiProcessTestCase),
                      {"__doc__": f"torch's {_suite.__name__}, with backend=TPD."})
        _class.__module__ = __name__
        globals()[_name] = _class
    del _suite, _name, _class

    class TpdTensorPipeCudaRpcTest(OnTpd, TensorPipeAgentCudaRpcTest, TpdBackendFixture,
                                   MultiProcessTestCase):
        """torch's TensorPipe agent's CUDA cases, with backend=TPD."""
else:
    def test_cuda_suites_need_a_gpu():
        pytest.skip("no CUDA GPU here: torch's CUDA suites with backend=TPD run on the GPU "
                    "machine (docs/python.md, backend=TPD's counts)")
