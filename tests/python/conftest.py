"""Fixtures of tpd's Python tests: real tpd daemons as child processes.

The binaries come from the Bazel runfiles (TPD_DAEMON, TPD_CLIENT_LIBRARY, set by
run_pytest.sh) or a source tree's bazel-bin.
"""

import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
# After PYTHONPATH: under Bazel that is the runfiles' python/, which also holds the built
# tpd._C; the source tree's python/ is for a plain `pytest tests/python`.
sys.path.append(str(REPO / "python"))
sys.path.insert(0, str(HERE))


def daemon_binary():
    return os.environ.get("TPD_DAEMON", str(REPO / "bazel-bin" / "daemon" / "tpd"))


class Daemon:
    """One tpd on a socket of its own, peer port on loopback, sharing ``token``; ``extra`` is
    appended to its config (TOML tables)."""

    def __init__(self, root, name, token, extra=""):
        self.dir = pathlib.Path(root) / name
        self.dir.mkdir(parents=True)
        self.socket = str(self.dir / "tpd.sock")
        self.config = self.dir / "tpd.toml"
        self.config.write_text(
            f'[daemon]\nsocket = "{self.socket}"\n'
            f'[peer]\nlisten_address = "127.0.0.1:0"\ntoken = "{token}"\nnode_name = "{name}"\n'
            + extra)
        self.log = open(self.dir / "log", "wb")
        self.proc = subprocess.Popen([daemon_binary(), "--config", str(self.config)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tpd did not start: {self.output()}")
            time.sleep(0.02)
        import tpd._client
        # Serving once a client gets its status through.
        while True:
            try:
                client = tpd._client.Client(self.socket)
                self.peer_address = client.status()["peer_address"]
                client.close()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def output(self):
        self.log.flush()
        return (self.dir / "log").read_text(errors="replace")

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def workdir():
    path = tempfile.mkdtemp(prefix="tpd-py-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


# tpd.rpc finds the job's group at TPD_RPC_HOME, or at the rendezvous host's daemon on this
# daemon's peer port; the daemons of these tests share one host on ports of their own, so the
# jobs name node0's.
@pytest.fixture
def daemon(workdir, monkeypatch):
    d = Daemon(workdir, "node0", secrets.token_hex(8))
    monkeypatch.setenv("TPD_RPC_HOME", f"tcp://{d.peer_address}")
    yield d
    d.stop()


@pytest.fixture
def two_daemons(workdir, monkeypatch):
    token = secrets.token_hex(8)
    ds = [Daemon(workdir, f"node{i}", token) for i in range(2)]
    monkeypatch.setenv("TPD_RPC_HOME", f"tcp://{ds[0].peer_address}")
    yield ds
    for d in ds:
        d.stop()
