"""The processes the Python tests run their ranks in.

Without a GPU, ranks fork from multiprocessing's fork server, which has imported torch and tpd
once: a spawned rank spends ~2 s of CPU importing torch, most of what a CPU case of torch's
suites costs, and CI's two cores run thousands of ranks. Not forked from the test process
itself: ranks forked from pytest hung (a forked child cannot reuse the parent's threads, and
tpd's client library loads a copy of its own there). Nor are test modules imported in the
server: each rank needs its own directory for the modules RemoteModule generates (torch's
instantiator makes one per process when imported).

With a GPU, ranks are spawned, as torch's suites spawn them there.
"""

import multiprocessing
import os

import torch

if torch.cuda.is_available():
    _CONTEXT = multiprocessing.get_context("spawn")
else:
    _CONTEXT = multiprocessing.get_context("forkserver")
    _CONTEXT.set_forkserver_preload(["torch", "tpd.rpc", "tpd.backend"])


class RankProcess(_CONTEXT.Process):
    """A rank's process, with the environment of the moment it was made (a fork server's
    children would otherwise have the server's, from when the server started: a test's
    TPD_RPC_HOME would reach no rank of a later test)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._environ = dict(os.environ)

    def run(self):
        os.environ.clear()
        os.environ.update(self._environ)
        super().run()


def queue():
    """A queue the ranks can put their results on."""
    return _CONTEXT.Queue()
