"""PyTorch's own RPC example programs (pytorch/examples, distributed/rpc) with backend=TPD, run
the way a user runs them: `python3 main.py`, its processes spawned by torch.multiprocessing,
on a tpd daemon. The copies in pytorch_examples/ (README.md there says what changed and why)
keep their RPC logic; each test checks the line a program prints when it has done its work.
"""

import os
import secrets
import socket
import subprocess
import sys

import pytest
import torch

from conftest import Daemon

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "pytorch_examples")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environment(daemon, **extra):
    """A program's environment: the daemon's socket, the job's home on it, the stand-ins."""
    return dict(
        os.environ, TPD_SOCKET=daemon.socket, TPD_RPC_HOME=f"tcp://{daemon.peer_address}",
        PYTHONPATH=os.pathsep.join([os.path.join(EXAMPLES, "stand_ins")] + sys.path), **extra)


def run_example(daemon, workdir, program, *args, env=None, timeout=300):
    """Runs pytorch_examples/`program` to its end; returns its output."""
    path = os.path.join(EXAMPLES, program)
    environment = _environment(daemon, MASTER_PORT=str(_free_port()), **(env or {}))
    result = subprocess.run([sys.executable, path, *args], cwd=workdir, env=environment,
                            capture_output=True, text=True, timeout=timeout)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    return output


def test_rnn_distributed_optimizer_and_autograd(daemon, workdir):
    # A model split between trainer and parameter server, DistributedOptimizer, dist_autograd.
    assert "Training epoch 9" in run_example(daemon, workdir, "rnn/main.py")


def test_pipeline_of_resnet_shards(daemon, workdir):
    # Two ResNet shards behind RRefs, micro-batches through rpc_async, dist_autograd and
    # DistributedOptimizer across three workers; four splits, four spawned jobs.
    output = run_example(daemon, workdir, "pipeline/main.py")
    for split in (1, 2, 4, 8):
        assert f"number of splits = {split}, execution time" in output


def test_parameter_server_with_distributed_optimizer(daemon, workdir):
    # One process per rank, as its README runs it: a parameter server and one trainer. (With
    # two trainers the program races with itself, on torch's own TensorPipe backend as on tpd:
    # one trainer's optimizer step changes weights another's backward still needs, "modified
    # by an inplace operation", and the server then waits forever.)
    port = str(_free_port())
    program = os.path.join(EXAMPLES, "parameter_server", "rpc_parameter_server.py")
    environment = _environment(daemon)
    ranks = [subprocess.Popen(
        [sys.executable, program, "--world_size=2", f"--rank={rank}", "--master_addr=127.0.0.1",
         f"--master_port={port}"], cwd=workdir, env=environment, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for rank in range(2)]
    try:
        outputs = [rank.communicate(timeout=300)[0] for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    assert [rank.returncode for rank in ranks] == [0, 0], "\n".join(outputs)[-6000:]
    assert "RPC shutdown on parameter server." in outputs[0]
    assert "Training complete!" in outputs[1] and "Accuracy" in outputs[1], outputs[1]


def test_batch_updating_parameter_server(workdir, monkeypatch):
    # async_execution on the server, a ResNet-50 sent back and forth, beside a gloo group. The
    # model is a 95 MB message, which the server sends to its five trainers at once: its arena
    # must hold all five (a reply that finds no room fails, it does not wait: docs/python.md,
    # "Tensors, memory and arena_bytes"). Shared memory is touched only where written.
    daemon = Daemon(workdir, "big", secrets.token_hex(8),
                    extra=f"[data]\narena_bytes = {512 << 20}\n")
    try:
        assert "Finish training" in run_example(daemon, workdir, "batch/parameter_server.py")
    finally:
        daemon.stop()


def test_batch_reinforce(daemon, workdir):
    # Observers stepping through RRefs, batched and one by one; prints "2, <batch s>, <one s>".
    output = run_example(daemon, workdir, "batch/reinforce.py", "--num-episode=2")
    assert any(line.startswith("2, ") for line in output.splitlines()), output[-3000:]


def test_reinforcement_learning_agent_and_observers(daemon, workdir):
    # Trains until solved: the stand-in CartPole is solved at a running reward of 1.
    output = run_example(daemon, workdir, "rl/main.py",
                         env={"TPD_EXAMPLES_REWARD_THRESHOLD": "1"})
    assert "Solved!" in output


@pytest.mark.skipif(torch.cuda.device_count() < 2,
                    reason="ddp_rpc needs two GPUs (the program exits without them): it runs "
                           "on the GPU machine")
def test_ddp_with_remote_module(daemon, workdir):
    # DistributedDataParallel trainers with a RemoteModule on a parameter server.
    output = run_example(daemon, workdir, "ddp_rpc/main.py")
    assert "Distributed RPC example completed successfully." in output
