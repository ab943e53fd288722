"""A tpd daemon for the Python benchmarks (rpc_bench.py, many_workers.py): started with a
config of its own, ready once a client gets its status through."""

import os
import subprocess
import time


class Daemon:
    """One tpd on this host, on a socket of its own and a peer port on loopback, sharing
    ``token`` with the others of the run: the shipped defaults but for what places it, and
    ``extra`` (TOML tables appended to its config)."""

    def __init__(self, binary, root, name, token, extra=""):
        self.name = name
        d = os.path.join(root, name)
        os.makedirs(d)
        self.socket = os.path.join(d, "tpd.sock")
        config = os.path.join(d, "tpd.toml")
        with open(config, "w") as f:
            f.write(f'[daemon]\nsocket = "{self.socket}"\nlog_level = "info"\n'
                    f'[peer]\nlisten_address = "127.0.0.1:0"\ntoken = "{token}"\n'
                    f'node_name = "{name}"\n' + extra)
        self.log_path = os.path.join(d, "log")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([binary, "--config", config], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT)
        from tpd._client import Client
        deadline = time.monotonic() + 20
        while True:  # serving once a client gets its status through
            if self.proc.poll() is not None:
                raise RuntimeError(f"tpd did not start, see {self.log_path}")
            try:
                client = Client(self.socket)
                self.peer_address = client.status()["peer_address"]
                client.close()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def peak_mib(self):
        """VmHWM in MiB; None once the daemon has exited."""
        if self.proc.poll() is not None:
            return None
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return None

    def last_log_line(self):
        with open(self.log_path, "rb") as f:
            lines = [line.strip() for line in f.read().decode(errors="replace").splitlines()]
        return next((line for line in reversed(lines) if line), "(no output)")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
