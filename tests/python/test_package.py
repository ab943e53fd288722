"""The package as users get it: installed offline with pip, and refusing to start without a
daemon."""

import os
import subprocess
import sys

import pytest

from conftest import REPO


def test_pip_installs_the_package_and_its_torch_extension_offline(workdir):
    target = os.path.join(workdir, "site")
    # The source tree lies behind Bazel's runfiles symlinks: install from a copy of what the
    # build reads (python/, and the C ABI's header the extension includes).
    source = os.path.join(workdir, "src")
    os.makedirs(os.path.join(source, "client", "c"))
    subprocess.run(["cp", "-rL", str(REPO / "python"), source], check=True)
    subprocess.run(["cp", "-L", str(REPO / "client" / "c" / "tpd_client.h"),
                    os.path.join(source, "client", "c")], check=True)
    # A _C the copy brought along from a build in the tree would hide pip's.
    subprocess.run(f"rm -f {source}/python/tpd/_C*.so", shell=True, check=True)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
         "--no-index", "--target", target, os.path.join(source, "python")],
        capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    check = subprocess.run(
        [sys.executable, "-c",
         "import tpd, tpd.rpc, tpd.backend, torch.distributed.rpc as rpc; "
         "print(tpd.__file__, tpd.rpc.TensorPipeRpcBackendOptions, rpc.BackendType.TPD)"],
        env=dict(os.environ, PYTHONPATH=target), capture_output=True, text=True, cwd=workdir)
    assert check.returncode == 0, check.stderr
    assert check.stdout.startswith(target), check.stdout
    assert "BackendType.TPD" in check.stdout


def test_the_backend_without_its_extension_says_what_is_missing(workdir):
    site = os.path.join(workdir, "site")
    os.makedirs(site, exist_ok=True)
    subprocess.run(["cp", "-rL", str(REPO / "python" / "tpd"), site], check=True)
    subprocess.run(f"rm -f {site}/tpd/_C*.so", shell=True, check=True)
    check = subprocess.run(
        [sys.executable, "-c",
         "import tpd.rpc\n"  # works without it
         "import tpd.backend"],
        env=dict(os.environ, PYTHONPATH=site), capture_output=True, text=True, cwd=workdir)
    assert check.returncode != 0
    assert "the TPD backend needs tpd's torch extension tpd._C" in check.stderr, check.stderr
    assert "libtorch-dev" in check.stderr


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
