"""The package as users get it: installed offline with pip, and refusing to start without a
daemon."""

import os
import subprocess
import sys

import pytest

from conftest import REPO


def test_pip_installs_the_package_offline(workdir):
    target = os.path.join(workdir, "site")
    # The source tree's python/ lies behind Bazel's runfiles symlinks: install from a copy.
    source = os.path.join(workdir, "src")
    subprocess.run(["cp", "-rL", str(REPO / "python"), source], check=True)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
         "--no-index", "--target", target, source],
        capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    check = subprocess.run(
        [sys.executable, "-c",
         "import tpd, tpd.rpc; print(tpd.__file__, tpd.rpc.TensorPipeRpcBackendOptions)"],
        env=dict(os.environ, PYTHONPATH=target), capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert check.stdout.startswith(target), check.stdout


def test_init_rpc_without_a_daemon_names_the_socket(workdir, monkeypatch):
    import tpd.rpc as rpc
    socket = os.path.join(workdir, "nobody.sock")
    monkeypatch.setenv("TPD_SOCKET", socket)
    with pytest.raises(RuntimeError, match="nobody.sock"):
        rpc.init_rpc("w", rank=0, world_size=1, rpc_backend_options=rpc.TensorPipeRpcBackendOptions(
            init_method=f"file://{workdir}/rendezvous"))
    # Nothing was left behind: a later init_rpc is not "already initialized".
    with pytest.raises(RuntimeError, match="nobody.sock"):
        rpc.init_rpc("w", rank=0, world_size=1, rpc_backend_options=rpc.TensorPipeRpcBackendOptions(
            init_method=f"file://{workdir}/rendezvous2"))
