"""PyTorch's own RPC tests (torch/testing/_internal/distributed/rpc/rpc_test.py) run against
tpd.rpc: torch.distributed.rpc's public functions are pointed at tpd.rpc's before torch's test
module is imported, so its tests, their fixtures (dist_init) and their assertions are torch's
own, unchanged; each rank is a process of its own, all on one tpd daemon this module starts.

    python3 -m pytest tests/python/test_torch_rpc.py

CORE lists the tests that must pass (docs/python.md says why the others do not run).
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "shims"))

import torch.distributed.rpc as torch_rpc  # noqa: E402
import torch.distributed.rpc.api as torch_rpc_api  # noqa: E402

import tpd.rpc as tpd_rpc  # noqa: E402
import tpd.rpc.api as tpd_api  # noqa: E402

# Point torch.distributed.rpc at tpd.rpc (what `import tpd.rpc as rpc` does for a program).
for _name in ("init_rpc", "shutdown", "rpc_sync", "rpc_async", "remote", "get_worker_info",
              "RRef", "TensorPipeRpcBackendOptions", "_get_current_rpc_agent"):
    setattr(torch_rpc, _name, getattr(tpd_rpc, _name))
for _name in ("rpc_sync", "rpc_async", "remote", "get_worker_info", "shutdown",
              "_get_current_rpc_agent", "_wait_all_workers", "_to_worker_info",
              "get_rpc_timeout", "_set_rpc_timeout", "_wait_all", "_thread_local_var",
              "_is_current_rpc_agent_set"):
    setattr(torch_rpc_api, _name, getattr(tpd_api, _name))
torch_rpc.get_rpc_timeout = tpd_api.get_rpc_timeout
torch_rpc._set_rpc_timeout = tpd_api._set_rpc_timeout

from torch.testing._internal.distributed.rpc import rpc_test  # noqa: E402
from torch.testing._internal.distributed.rpc.tensorpipe_rpc_agent_test_fixture import (  # noqa: E402,E501
    TensorPipeRpcAgentTestFixture,
)
from torch.testing._internal.common_distributed import MultiProcessTestCase  # noqa: E402

from torch_harness import OnTpd, keep_only  # noqa: E402

# The tests that must pass: calls sync and async, builtins and user functions, exceptions,
# timeouts, futures, async_execution, worker info, init and shutdown, remote and RRef basics.
CORE = [
    "test_worker_id",
    "test_get_worker_infos",
    "test_self_add",
    "test_send_to_rank",
    "test_add",
    "test_add_with_id",
    "test_scalar_add",
    "test_async_add",
    "test_nonzero",
    "test_multi_rpc",
    "test_py_built_in",
    "test_py_user_defined",
    "test_py_class_constructor",
    "test_py_class_instance_method",
    "test_py_class_method",
    "test_py_class_static_method",
    "test_py_multi_async_call",
    "test_py_no_return_result",
    "test_py_tensors",
    "test_py_tensors_multi_async_call",
    "test_py_tensors_in_container",
    "test_py_nested_pickle",
    "test_py_function_exception",
    "test_py_raise_in_user_func",
    "test_nested_rpc",
    "test_stress_light_rpc",
    "test_stress_heavy_rpc",
    "test_builtin_remote_ret",
    "test_builtin_remote_self",
    "test_multi_builtin_remote_ret",
    "test_py_udf_remote",
    "test_multi_py_udf_remote",
    "test_py_rref_args",
    "test_py_rref_args_user_share",
    "test_py_rpc_rref_args",
    "test_nested_remote",
    "test_nested_rref",
    "test_rref_forward_chain",
    "test_local_rref_no_fork",
    "test_return_local_rrefs",
    "test_rref_proxy_non_exist",
    "test_rref_proxy_tensor",
    "test_rref_proxy_tensor_self",
    "test_rref_proxy_reuse",
    "test_rref_proxy_class",
    "test_rref_proxy_class_self",
    "test_wait_all",
    "test_wait_all_multiple_call",
    "test_wait_all_raise_in_user_func",
    "test_future_wait_twice",
    "test_callback_simple",
    "test_callback_wrong_arg_num",
    "test_callback_multi",
    "test_callback_chain",
    "test_async_function_simple",
    "test_async_function_wrong_return_type",
    "test_async_function_with_future_ctor",
    "test_async_function_chained",
    "test_async_function_nested",
    "test_async_function_multi_chained",
    "test_async_function_multi_fanout",
    "test_return_future",
    "test_rpc_return_rref",
    "test_rpc_timeouts",
    "test_default_timeout_used",
    "test_dist_init_decorator",
    "test_shutdown_followed_by_rpc",
    "test_expected_src",
    "test_invalid_names",
    # Issue 36: torch's error types and words, RRefs after shutdown and their creation's
    # timeout, and cases that passed while listed as not run.
    "test_duplicate_name_2",
    "test_cannot_infer_backend_from_options",
    "test_use_rref_after_shutdown",
    "test_rref_py_pickle_not_supported",
    "test_rref_type_with_error_blocking",
    "test_rref_type_with_error_non_blocking",
    "test_async_record_function_double_end_callbacks",
    "test_async_record_function_double_end_callbacks_new_signatures",
    "test_ignore_rref_leak",
    "test_init_pg_then_rpc",
    "test_init_rpc_then_pg",
    "test_init_rpc_twice",
    "test_async_class_rref_proxy",
    "test_async_class_rref_proxy_async",
    "test_async_class_rref_proxy_remote",
    "test_my_parameter_server",
    "test_callback_with_ret",
]


class TpdRpcTest(OnTpd, TensorPipeRpcAgentTestFixture, rpc_test.RpcTest, MultiProcessTestCase):
    """torch's RpcTest, its ranks on tpd."""


keep_only(TpdRpcTest, rpc_test.RpcTest, CORE)


# torch's TensorPipeAgentRpcTest cases that apply to tpd: options of the wrong type, builtin
# operators with arguments that match no schema, RRef timeouts, dynamic groups.
TENSORPIPE = [
    "test_mismatched_type_for_options",
    "test_op_with_invalid_args",
    "test_rref_get_type_timeout_blocking",
    "test_rref_get_type_timeout_non_blocking",
    "test_rref_proxy_timeout",
    "test_dynamic_rpc_init_rpc",
    "test_dynamic_rpc_init_rpc_without_rank",
    "test_dynamic_rpc_new_rank_can_communicated_with_existing_rank",
    "test_dynamic_rpc_existing_rank_can_communicate_with_new_rank",
    "test_dynamic_and_static_init_rpc_together",
    "test_my_parameter_server_sparse",
    "test_set_and_get_num_worker_threads",
]


class TpdTensorPipeRpcTest(OnTpd, TensorPipeRpcAgentTestFixture,
                           rpc_test.TensorPipeAgentRpcTest, MultiProcessTestCase):
    """torch's TensorPipeAgentRpcTest, its ranks on tpd."""


keep_only(TpdTensorPipeRpcTest, rpc_test.TensorPipeAgentRpcTest, TENSORPIPE)


# torch's CUDA RPC tests that apply to tpd (device maps validated at init, tensors moved by
# them both ways, cpu in maps, custom streams, RRefs of CUDA values). They skip themselves
# (torch's skip_if_lt_x_gpu) on machines with fewer than two GPUs, as in CI.
CUDA = [
    "test_device_maps_wrong_worker_name",
    "test_device_maps_invalid_max_local_device",
    "test_device_maps_invalid_max_remote_device",
    "test_device_maps_many_to_one",
    "test_device_maps_one_to_many",
    "test_device_maps_invalid_min_device",
    "test_device_maps_gpu",
    "test_device_map_cpu",
    "test_device_map_cpu_to_gpu_default",
    "test_device_map_cpu_to_gpu_non_default",
    "test_device_map_gpu_to_cpu_default",
    "test_device_map_gpu_to_cpu_non_default",
    "test_device_map_gpu_default",
    "test_device_map_gpu_non_default",
    "test_device_map_gpu_default_to_non_default",
    "test_device_map_gpu_non_default_to_default",
    "test_device_map_gpu_mixed_1",
    "test_device_map_gpu_mixed_2",
    "test_device_map_gpu_mixed_3",
    "test_device_map_gpu_mixed_4",
    "test_device_maps_multi_gpu",
    "test_device_maps_return_to_gpu",
    "test_device_maps_in_options",
    "test_device_maps_remote",
    "test_custom_stream",
    "test_custom_stream_multi",
    "test_rref_to_here_synchronization1",
    "test_rref_as_arg_synchronization1",
]


class TpdCudaRpcTest(OnTpd, TensorPipeRpcAgentTestFixture,
                     rpc_test.TensorPipeAgentCudaRpcTest, MultiProcessTestCase):
    """torch's TensorPipeAgentCudaRpcTest, its ranks on tpd."""


keep_only(TpdCudaRpcTest, rpc_test.TensorPipeAgentCudaRpcTest, CUDA)
