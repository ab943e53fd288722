"""Many workers of one job on one node: torch.distributed.rpc beside tpd.rpc (docs/BENCHMARKS.md,
tier B9; issue 31).

    TPD_CLIENT_LIBRARY=bazel-bin/client/c/libtpd_client.so \\
    python3 bench/python/many_workers.py --tpd bazel-bin/daemon/tpd \\
        [--workers 16,24,64,128,256] [--backends torch,tpd] [--daemons K] [--timeout S] \\
        [--json out.json] [--keep]

For each N and each backend (torch's own TensorPipe agent, then tpd.rpc) one job of N worker
processes (`worker0` .. `worker<N-1>`) is started on this host, each a fresh Python that
imports torch. Both backends get the same options: a tcp:// init_method on 127.0.0.1, the
same `rpc_timeout` (the job's `--timeout`, so that nothing in RPC gives up before the
benchmark does) and 4 worker threads (256 processes must not start thousands of threads).
tpd jobs run on K fresh daemons of this host (`--daemons`, default 1), workers spread over
them round-robin and the daemons joined over their peer ports; the daemons run with the
shipped defaults: their config names only their sockets, peer port, token, node name and log
level, never a session or arena limit, since those defaults are what is measured.

The workers meet at the benchmark's own barrier (a TCP connection each to this process)
between the stages, so each stage starts together in every worker. Columns, seconds unless
said otherwise:

- imports: from the first worker's start to the last worker having imported torch and the
  backend (the benchmark's barrier; the machine's cost of N Pythons, not RPC's);
- init p50 / max: `init_rpc` in each worker, timed inside it, all starting at once;
- start->last init: from the first worker's start to the last `init_rpc` returning;
- all-to-all 1st / 2nd: every worker `rpc_async`s an empty function to every other worker
  and waits for all of them; from the barrier's release to the last worker done. The first
  round pays what a backend sets up lazily (torch's pipes between each pair), the second is
  warm;
- shutdown max: the slowest worker's graceful `rpc.shutdown()`, all starting at once;
- daemon peak MiB: VmHWM of the daemon (the largest of the K) after the job; it counts the
  pages of the sessions' shared segments that the daemon touched. torch has none: "—".

A job that fails is a row too, with the stage it failed in and its first error (a worker's
exception, one that exited, or the job's `--timeout`, past which every worker is killed), and
the run goes on: torch's agent can fail to initialize past ~18 workers on one host
(pytorch#85607; it did at 24 on the GPU machine), and a daemon refuses sessions past its
per-uid limit. Every figure is from
the same run on the same machine (docs/BENCHMARKS.md's rules); `--json` writes the rows with
every figure and the full first error line.
"""

import argparse
import ctypes
import json
import os
import resource
import secrets
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))

from bench_daemon import Daemon  # noqa: E402 - after the path to tpd's package

NUM_WORKER_THREADS = 4
# The all-to-all rounds: the stage each worker reports, and the row's key.
ROUNDS = {"all-to-all 1st": "all_to_all_1st_s", "all-to-all 2nd": "all_to_all_2nd_s"}
PR_SET_PDEATHSIG = 1


def noop():
    return None


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _first_line(text, limit=None):
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    line = lines[0] if lines else "(no message)"
    if limit and len(line) > limit:
        line = line[:limit - 1] + "…"
    return line


def _last_line(path):
    with open(path, "rb") as f:
        lines = [line.strip() for line in f.read().decode(errors="replace").splitlines()]
    return next((line for line in reversed(lines) if line), "(no output)")


# --- The worker: one process of a job ------------------------------------------------------

def worker_main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int)
    parser.add_argument("--world-size", type=int)
    parser.add_argument("--backend")
    parser.add_argument("--init-method")
    parser.add_argument("--coordinator", type=int)
    parser.add_argument("--parent", type=int)
    parser.add_argument("--rpc-timeout", type=float)
    args = parser.parse_args(argv)
    # Killed with the benchmark, whatever kills it: a worker must never outlive its job.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != args.parent:
        os._exit(1)
    conn = socket.create_connection(("127.0.0.1", args.coordinator))
    inbox = conn.makefile("rb")

    def send(**message):
        conn.sendall((json.dumps(message) + "\n").encode())

    def barrier():
        if inbox.readline() != b"go\n":  # the benchmark went away
            os._exit(1)

    send(hello=args.rank)
    stage = "imports"
    try:
        import torch
        if args.backend == "torch":
            import torch.distributed.rpc as rpc
        else:
            import tpd.rpc as rpc
        send(stage=stage, value=torch.__version__)
        barrier()
        stage = "init"
        options = rpc.TensorPipeRpcBackendOptions(init_method=args.init_method,
                                                  rpc_timeout=args.rpc_timeout,
                                                  num_worker_threads=NUM_WORKER_THREADS)
        start = time.monotonic()
        rpc.init_rpc(f"worker{args.rank}", rank=args.rank, world_size=args.world_size,
                     rpc_backend_options=options)
        send(stage=stage, value=[start, time.monotonic()])
        peers = [f"worker{r}" for r in range(args.world_size) if r != args.rank]
        for stage in ROUNDS:
            barrier()
            torch.futures.wait_all([rpc.rpc_async(peer, noop) for peer in peers])
            send(stage=stage, value=time.monotonic())
        barrier()
        stage = "shutdown"
        start = time.monotonic()
        rpc.shutdown()
        send(stage=stage, value=[start, time.monotonic()])
    except BaseException as e:  # the benchmark must hear of every failure, Ctrl-C's too
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        try:
            send(error=f"{type(e).__name__}: {_first_line(e)}", stage=stage)
        finally:
            # Not through the interpreter's exit: an agent left half made may hang there.
            os._exit(1)
    conn.close()


# --- The benchmark's side of a job -----------------------------------------------------------

class JobFailed(Exception):
    def __init__(self, stage, error):
        super().__init__(error)
        self.stage = stage
        self.error = error


class Job:
    """N worker processes and the barrier they meet at: each connects here, says when it has
    finished a stage (one JSON line), and waits for "go" to start the next."""

    def __init__(self, backend, n, daemons, logdir, timeout):
        self.backend = backend
        self.n = n
        self.daemons = daemons
        self.logdir = logdir
        self.timeout = timeout
        self.init_method = f"tcp://127.0.0.1:{_free_port()}"
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=n)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.conns = {}                # rank -> socket
        self.ranks = {}                # socket -> rank
        self.buffers = {}              # socket -> bytes not yet a whole line
        self.done = {}                 # stage -> {rank: value}
        self.errors = []               # (stage, "rank r: error"), in the order they came
        self.exited = set()
        self.procs = []
        self.started = self.deadline = None

    def start(self):
        env = dict(os.environ)
        # Nothing here computes: no per-core thread pools in each of N processes.
        env["OMP_NUM_THREADS"] = "1"
        env["MKL_NUM_THREADS"] = "1"
        if self.daemons:
            # The daemons share this host on ports of their own: the job's group lives at
            # node0's (tpd.rpc would look on each worker's own daemon's port otherwise).
            env["TPD_RPC_HOME"] = f"tcp://{self.daemons[0].peer_address}"
        # Times are CLOCK_MONOTONIC (time.monotonic), one clock for every process of the host,
        # so the workers' stamps and this process's compare.
        self.started = time.monotonic()
        self.deadline = self.started + self.timeout
        for rank in range(self.n):
            if self.daemons:
                env["TPD_SOCKET"] = self.daemons[rank % len(self.daemons)].socket
            with open(os.path.join(self.logdir, f"worker{rank}.log"), "wb") as log:
                self.procs.append(subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "--worker",
                     "--rank", str(rank), "--world-size", str(self.n),
                     "--backend", self.backend, "--init-method", self.init_method,
                     "--coordinator", str(self.listener.getsockname()[1]),
                     "--parent", str(os.getpid()), "--rpc-timeout", str(self.timeout)],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env))

    def _pump(self, timeout):
        for key, _ in self.selector.select(timeout):
            sock = key.fileobj
            if sock is self.listener:
                conn, _ = sock.accept()
                self.selector.register(conn, selectors.EVENT_READ)
                self.buffers[conn] = b""
                continue
            data = sock.recv(65536)
            if not data:
                self.selector.unregister(sock)
                continue
            self.buffers[sock] += data
            while b"\n" in self.buffers[sock]:
                line, self.buffers[sock] = self.buffers[sock].split(b"\n", 1)
                self._on_message(sock, json.loads(line))

    def _on_message(self, sock, message):
        if "hello" in message:
            self.conns[message["hello"]] = sock
            self.ranks[sock] = message["hello"]
        elif "error" in message:
            self.errors.append((message["stage"], f"rank {self.ranks[sock]}: {message['error']}"))
        else:
            self.done.setdefault(message["stage"], {})[self.ranks[sock]] = message["value"]

    def _check_exits(self, stage):
        for rank, proc in enumerate(self.procs):
            if rank in self.exited or proc.poll() is None:
                continue
            self.exited.add(rank)
            self._pump(0)  # what it said before it went comes first
            if proc.returncode == 0 and rank in self.done.get("shutdown", {}):
                continue
            if not any(error.startswith(f"rank {rank}:") for _, error in self.errors):
                self.errors.append((stage, f"rank {rank} exited with code {proc.returncode}: "
                                           f"{self._last_log_line(rank)}"))

    def _last_log_line(self, rank):
        return _last_line(os.path.join(self.logdir, f"worker{rank}.log"))

    def wait(self, stage):
        """Every worker's value for `stage`; JobFailed at the first error or the deadline."""
        while len(self.done.get(stage, {})) < self.n:
            if self.errors:
                raise JobFailed(*self.errors[0])
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise JobFailed(stage, f"timed out after {self.timeout:g} s, "
                                       f"{len(self.done.get(stage, {}))} of {self.n} workers "
                                       f"through {stage}")
            self._pump(min(left, 0.2))
            self._check_exits(stage)
        return self.done[stage]

    def release(self):
        """Lets every worker start its next stage; returns when it did (CLOCK_MONOTONIC)."""
        released = time.monotonic()
        for conn in self.conns.values():
            try:
                conn.sendall(b"go\n")
            except OSError:
                pass  # a worker gone: wait() reports it with what it left in its log
        return released

    def wait_exit(self):
        for rank, proc in enumerate(self.procs):
            try:
                proc.wait(timeout=max(0.0, self.deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise JobFailed("exit", f"rank {rank} had not exited {self.timeout:g} s "
                                        f"after the job's start") from None
            if proc.returncode != 0:
                raise JobFailed("exit", f"rank {rank} exited with code {proc.returncode}: "
                                        f"{self._last_log_line(rank)}")

    def close(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for sock in list(self.conns.values()) + [self.listener]:
            sock.close()
        self.selector.close()


def run_job(backend, n, daemons, logdir, args):
    """One row: every figure of the stages the job got through, and its failure if any."""
    row = {"backend": backend, "workers": n, "daemons": len(daemons), "ok": False}
    job = Job(backend, n, daemons, logdir, args.timeout)
    try:
        job.start()
        ready = job.wait("imports")
        row["torch_version"] = next(iter(ready.values()))
        row["imports_s"] = time.monotonic() - job.started
        job.release()
        inits = job.wait("init").values()
        durations = [end - start for start, end in inits]
        row["init_p50_s"] = statistics.median(durations)
        row["init_max_s"] = max(durations)
        row["start_to_last_init_s"] = max(end for _, end in inits) - job.started
        for stage, key in ROUNDS.items():
            released = job.release()
            row[key] = max(job.wait(stage).values()) - released
        job.release()
        row["shutdown_max_s"] = max(end - start for start, end in job.wait("shutdown").values())
        job.wait_exit()
        row["ok"] = True
    except JobFailed as e:
        row["stage"] = e.stage
        row["error"] = e.error
    finally:
        job.close()
    for d in daemons:
        if d.proc.poll() is not None and row["ok"]:
            row.update(ok=False, stage="daemon", error=f"{d.name} exited with code "
                                                       f"{d.proc.returncode}: {d.last_log_line()}")
    row["daemon_peak_mib"] = [d.peak_mib() for d in daemons]
    return row


# --- Daemons -------------------------------------------------------------------------------

def start_daemons(binary, root, count):
    token = secrets.token_hex(8)
    daemons = []
    try:
        for i in range(count):
            daemons.append(Daemon(binary, root, f"node{i}", token))
    except BaseException:
        for d in daemons:
            d.stop()
        raise
    return daemons


# --- The run ---------------------------------------------------------------------------------

def _cell(value, digits=2):
    return "—" if value is None else f"{value:.{digits}f}"


def print_table(rows, args):
    torch_version = next((r["torch_version"] for r in rows if "torch_version" in r), "?")
    print(f"{os.cpu_count()} cores, Python {sys.version.split()[0]}, torch {torch_version}, "
          f"{NUM_WORKER_THREADS} worker threads, timeout {args.timeout:g} s, tpd on "
          f"{args.daemons} daemon(s); seconds unless said otherwise\n")
    print("| backend | N | result | imports | init p50 | init max | start->last init | "
          "all-to-all 1st | all-to-all 2nd | shutdown max | daemon peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["ok"]:
            result = "ok"
        else:
            error = _first_line(r["error"], 110).replace("|", "\\|")
            result = f"failed ({r['stage']}): {error}"
        peaks = [p for p in r["daemon_peak_mib"] if p is not None]
        print(f"| {r['backend']} | {r['workers']} | {result} | {_cell(r.get('imports_s'), 1)} | "
              f"{_cell(r.get('init_p50_s'))} | {_cell(r.get('init_max_s'))} | "
              f"{_cell(r.get('start_to_last_init_s'), 1)} | "
              f"{_cell(r.get('all_to_all_1st_s'), 3)} | {_cell(r.get('all_to_all_2nd_s'), 3)} | "
              f"{_cell(r.get('shutdown_max_s'))} | "
              f"{_cell(max(peaks), 0) if peaks else '—'} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tpd", default=os.environ.get("TPD_DAEMON"),
                        help="the tpd binary (default $TPD_DAEMON)")
    parser.add_argument("--workers", default="16,24,64,128,256",
                        help="comma-separated worker counts (default 16,24,64,128,256)")
    parser.add_argument("--backends", default="torch,tpd", help="torch, tpd or both")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a job may take, start to exit, before it is killed")
    parser.add_argument("--daemons", type=int, default=1,
                        help="tpd daemons on this host the workers are spread over")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--keep", action="store_true",
                        help="keep the workers' and daemons' logs (the directory is printed)")
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    backends = args.backends.split(",")
    if set(backends) - {"torch", "tpd"} or args.daemons < 1:
        parser.error("--backends takes torch and tpd; --daemons at least 1")
    if "tpd" in backends and not args.tpd:
        parser.error("--tpd (or $TPD_DAEMON) names the daemon binary")
    # The daemon serves hundreds of sessions, each with descriptors of its own: the limit
    # deploy/tpd.service gives it (LimitNOFILE), inherited from here.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 65536 if hard == resource.RLIM_INFINITY else min(65536, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    # A SIGTERM ends the run through the cleanup below, as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))

    root = tempfile.mkdtemp(prefix="tpd-many-", dir="/tmp")
    rows = []
    try:
        for n in counts:
            for backend in backends:
                logdir = os.path.join(root, f"{backend}-{n}")
                os.makedirs(logdir)
                daemons = []
                try:
                    if backend == "tpd":
                        daemons = start_daemons(args.tpd, logdir, args.daemons)
                    row = run_job(backend, n, daemons, logdir, args)
                finally:
                    for d in daemons:
                        d.stop()
                rows.append(row)
                state = "ok" if row["ok"] else f"failed ({row['stage']}): {row['error']}"
                print(f"{backend} N={n}: {state}", file=sys.stderr, flush=True)
    finally:
        if args.keep:
            print(f"logs: {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print_table(rows, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cores": os.cpu_count(), "python": sys.version.split()[0],
                       "num_worker_threads": NUM_WORKER_THREADS, "timeout_s": args.timeout,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker_main(sys.argv[2:])
    else:
        main()
