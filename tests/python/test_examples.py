"""examples/python run unchanged (as torch programs with the import changed) on tpd."""

import os
import socket
import subprocess
import sys

import pytest

from conftest import REPO


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("example", ["parameter_server.py", "rl_observer_agent.py"])
def test_example_runs_across_two_daemons(two_daemons, example):
    # The examples live beside the package in a source tree, and under runfiles in Bazel.
    path = REPO / "examples" / "python" / example
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               PYTHONPATH=os.pathsep.join(sys.path))
    procs = []
    for rank in range(3):
        env_rank = dict(env, TPD_SOCKET=two_daemons[rank % 2].socket)
        procs.append(subprocess.Popen([sys.executable, str(path), "--rank", str(rank),
                                       "--world_size", "3"], env=env_rank,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = [p.communicate(timeout=120)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    assert ("parameter server: 30 steps" in outputs[0]
            or "agent: 2 observers x 50 steps" in outputs[0]), outputs[0]
