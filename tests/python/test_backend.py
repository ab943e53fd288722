"""backend=TPD (tpd._C, tpd.backend) beyond torch's own suites (test_torch_backend.py): how
tensors travel, and where it does not start."""

import os
import subprocess
import sys

import pytest

import rpc_workers
import scenarios
from conftest import Daemon


@pytest.fixture
def small_arena(workdir, monkeypatch):
    """A daemon whose sessions have 16 MiB heaps each way."""
    d = Daemon(workdir, "node0", os.urandom(8).hex(), extra="[data]\narena_bytes = 16777216\n")
    monkeypatch.setenv("TPD_RPC_HOME", f"tcp://{d.peer_address}")
    yield d
    d.stop()


def test_tensors_of_every_kind_arrive_intact_and_kept_ones_stay_so(small_arena, workdir):
    results = rpc_workers.run(scenarios.backend_tensors, 2, [small_arena.socket],
                              f"file://{workdir}/rendezvous")
    assert results == {0: True, 1: True}


def test_backend_tpd_does_not_start_in_a_forked_child(daemon, workdir):
    results = rpc_workers.run(scenarios.backend_in_forked_child, 1, [daemon.socket],
                              f"file://{workdir}/rendezvous")
    assert "backend=TPD cannot start in a process forked from process" in results[0], results
    assert "'spawn'" in results[0], results


def test_a_worker_that_exits_without_shutdown_exits_cleanly(daemon, workdir):
    """A program that ends without rpc.shutdown() (torch's tests that set up RPC themselves
    do) exits with its own status, not an abort from the agent's teardown."""
    program = (
        "import torch.distributed.rpc as rpc, tpd.backend\n"
        "rpc.init_rpc('w0', backend=rpc.BackendType.TPD, rank=0, world_size=1,\n"
        f"             rpc_backend_options=rpc.TensorPipeRpcBackendOptions("
        f"init_method='file://{workdir}/rendezvous'))\n"
        "assert rpc.rpc_sync('w0', max, args=(1, 2)) == 2\n")
    env = dict(os.environ, TPD_SOCKET=daemon.socket)
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]


def test_a_worker_killed_during_a_distributed_backward_pass_fails_it_and_leaks_nothing(
        daemon, workdir):
    results = rpc_workers.run(scenarios.backend_killed_during_backward, 2, [daemon.socket],
                              f"file://{workdir}/rendezvous", may_die={1})
    message, took, info = results[0]
    assert "worker1" in message, message
    assert took < 30, (took, message)
    assert int(info["num_autograd_contexts"]) == 0, info
    assert int(info["num_current_backward_passes"]) == 0, info
