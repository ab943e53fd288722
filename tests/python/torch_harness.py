"""What the modules that run torch's own RPC test suites against tpd share: one tpd daemon for
the run, which the ranks' processes (rank_processes.RankProcess, started by torch's
MultiProcessTestCase) reach through the environment, and the choice of torch's cases to run."""

import atexit
import os
import secrets
import shutil
import tempfile

from rank_processes import RankProcess


class _Daemon:
    """The one daemon of the run, started by the first test (in the parent process)."""
    daemon = None


def _ensure_daemon():
    if _Daemon.daemon is None:
        import conftest
        root = tempfile.mkdtemp(prefix="tpd-torch-", dir="/tmp")
        _Daemon.daemon = conftest.Daemon(root, "node0", secrets.token_hex(8))
        os.environ["TPD_SOCKET"] = _Daemon.daemon.socket
        os.environ["TPD_RPC_HOME"] = f"tcp://{_Daemon.daemon.peer_address}"
        atexit.register(_stop_daemon, root)  # the ranks' processes are gone by then
    return _Daemon.daemon


def _stop_daemon(root):
    _Daemon.daemon.stop()
    shutil.rmtree(root, ignore_errors=True)


class OnTpd:
    """Runs a torch test class's ranks as processes on this run's tpd daemon."""

    def setUp(self):
        _ensure_daemon()
        super().setUp()
        self._start_processes(RankProcess)


def keep_only(cls, torch_tests, kept):
    """Collects only the `kept` cases of `torch_tests` in `cls`; docs/python.md says why the
    others are not run."""
    for name in dir(torch_tests):
        if name.startswith("test_") and name not in kept:
            setattr(cls, name, None)
