"""tpd.rpc beside torch.distributed.rpc, measured in the same run (docs/BENCHMARKS.md, "P").

    python3 bench/python/rpc_bench.py --tpd bazel-bin/daemon/tpd [--cuda] [--quick]

For each backend (torch's own TensorPipe agent, then tpd.rpc, and with --backend torch's RPC
module on tpd: backend=TPD, tpd._C) two worker processes are started, rank 0 measuring and
rank 1 answering, and for tpd both on one daemon ("one node") and on two daemons ("two
daemons", joined over their peer ports). Rows:

- P1 empty call: rpc_sync of a function returning None, p50 and p99 (µs);
- P2 rpc_async throughput: calls/s with 64 in flight;
- P3 CPU tensor round trip of 1, 16 and 256 MiB (the callee returns what it got; --p3_kib for
  other sizes; --p3_arena: tpd.rpc's built by tpd.rpc.empty), median ms;
- P4 (--cuda, two GPUs) a CUDA tensor cuda:0 -> cuda:1 and back by device maps, median ms.

Every ratio is torch's time over tpd's (above 1: tpd is faster), from the same run.

P0 (--probe, the built bench/python/callback_probe.so): a ctypes callback run by a native
thread against the same callback on a Python thread, per call, in this process.

--breakdown: where an empty tpd.rpc call's time goes (--breakdown_kib: a call echoing a tensor
of that size), tpd one node only. In process: the
pickling of the request and the reply (both ways) and one ctypes call into the library. Then
p50s of the intervals of an empty rpc_sync between stamps taken in both workers (one clock
for the host) around the library's call, next_event and reply: the Python of each side, and
the two ways between the library calls (the daemon's hop and the hand-offs between threads),
the share of the calls the callee ran on the thread that ran the call before, and the daemon's
own part of each way (Admin.Status's local.deliver and local.reply).
"""

import argparse
import multiprocessing
import os
import secrets
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))

from bench_daemon import Daemon  # noqa: E402 - after the path to tpd's package


def noop():
    return None


def echo(x):
    return x


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _percentile(samples, q):
    samples = sorted(samples)
    return samples[min(len(samples) - 1, int(q * len(samples)))]


def _measure(rpc, torch, args):
    peer = "bench1"
    rows = {}
    n = 300 if args.quick else 3000
    for _ in range(200):
        rpc.rpc_sync(peer, noop)
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        rpc.rpc_sync(peer, noop)
        lat.append((time.perf_counter() - t) * 1e6)
    rows["P1 empty call p50 us"] = _percentile(lat, 0.5)
    rows["P1 empty call p99 us"] = _percentile(lat, 0.99)
    calls = 1000 if args.quick else 10000
    window = 64
    t = time.perf_counter()
    futs = []
    for i in range(calls):
        futs.append(rpc.rpc_async(peer, noop))
        if len(futs) >= window:
            futs.pop(0).wait()
    for f in futs:
        f.wait()
    rows["P2 rpc_async calls/s"] = calls / (time.perf_counter() - t)
    for kib in args.p3_kib:
        if args.p3_arena and hasattr(rpc, "empty"):  # tpd.rpc: built in the arena, sent uncopied
            x = rpc.empty(kib << 8).fill_(1)
        else:
            x = torch.ones(kib << 8)  # float32: kib KiB
        reps = 3 if kib >= 256 << 10 else (5 if args.quick else 20)
        rpc.rpc_sync(peer, echo, args=(x,))
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            y = rpc.rpc_sync(peer, echo, args=(x,))
            times.append((time.perf_counter() - t) * 1e3)
            del y
        size = f"{kib >> 10} MiB" if kib % 1024 == 0 else f"{kib} KiB"
        rows[f"P3 CPU {size} round trip ms"] = statistics.median(times)
    if args.cuda:
        for mib in (1, 256):
            x = torch.ones(mib << 18, device="cuda:0")
            rpc.rpc_sync(peer, echo, args=(x,))
            times = []
            for _ in range(10):
                torch.cuda.synchronize()
                t = time.perf_counter()
                y = rpc.rpc_sync(peer, echo, args=(x,))  # noqa: F841 (held until timed)
                torch.cuda.synchronize()
                times.append((time.perf_counter() - t) * 1e3)
                del y
            rows[f"P4 CUDA {mib} MiB cuda:0->cuda:1 round trip ms"] = statistics.median(times)
    return rows


# Stamps (time.perf_counter_ns, CLOCK_MONOTONIC: one clock for every process of the host) taken
# around the library's calls in both workers by --breakdown; one call is in flight at a time.
_STAMPS = {"reply_in": 0, "reply_out": 0}


def _stamped(x=None):
    """--breakdown's function: the callee's stamps of this call so far, those of its previous
    reply (taken after this function returned last time), the thread, and ``x`` (an echo)."""
    return (_STAMPS["request_out"], time.perf_counter_ns(), _STAMPS["reply_in"],
            _STAMPS["reply_out"], threading.get_ident(), x)


def _stamp_library_calls():
    """Wraps the tpd client's call, next_event and reply to stamp when each enters or returns."""
    from tpd import _client
    clock = time.perf_counter_ns
    call, next_event, reply = _client.Client.call, _client.Client.next_event, _client.Event.reply

    def stamped_call(self, *a, **k):
        _STAMPS["call_in"] = clock()
        event = call(self, *a, **k)
        _STAMPS["call_out"] = clock()
        return event

    def stamped_next_event(self, *a, **k):
        event = next_event(self, *a, **k)
        _STAMPS["request_out"] = clock()
        return event

    def stamped_reply(self, *a, **k):
        _STAMPS["reply_in"] = clock()
        reply(self, *a, **k)
        _STAMPS["reply_out"] = clock()

    _client.Client.call = stamped_call
    _client.Client.next_event = stamped_next_event
    _client.Event.reply = stamped_reply


# --breakdown's rows: (name, interval between two stamps of one call).
_BREAKDOWN = [
    ("caller: rpc_sync to the library call (api, pickle)", "start", "call_in"),
    ("request: caller's library call to callee's next_event", "call_in", "request_out"),
    ("callee: next_event to the function (unpickle, dispatch)", "request_out", "function"),
    ("callee: the function to its reply call (pickle)", "function", "reply_in"),
    ("callee: the reply call itself", "reply_in", "reply_out"),
    ("reply: callee's reply call to caller's call returning", "reply_in", "call_out"),
    ("caller: the call returning to rpc_sync's (unpickle)", "call_out", "end"),
    ("the whole rpc_sync", "start", "end"),
]


def _breakdown(rpc, torch, args):
    import pickle
    from tpd import _capi
    from tpd.rpc import _agent, _pickler
    n = 2000 if args.quick else 20000
    lib = _capi.library()

    def per_call_us(fn, count):
        t = time.perf_counter()
        for _ in range(count):
            fn()
        return (time.perf_counter() - t) / count * 1e6

    request = (_agent.CALL, noop, (), {})
    reply = (True, None)
    rows = {
        "in process: pickle request+reply (dumps, loads)": per_call_us(
            lambda: (pickle.loads(_pickler.dumps(request)[0]),
                     pickle.loads(_pickler.dumps(reply)[0])), n),
        "in process: one ctypes call (tpd_abi_version)": per_call_us(lib.tpd_abi_version, n),
    }
    # --breakdown_kib: the call echoes a float32 tensor of that many KiB (0: an empty call).
    x = (torch.ones(args.breakdown_kib << 8),) if args.breakdown_kib else ()
    for _ in range(200):
        rpc.rpc_sync("bench1", _stamped, args=x)
    client = rpc.api._require_initialized().client
    before = _wakeups(client)
    calls = []
    same_thread = 0  # calls the callee ran on the thread that ran the call before
    last_thread = None
    previous = None
    for _ in range(n // 2):
        start = time.perf_counter_ns()
        request_out, function, reply_in, reply_out, thread, _ = rpc.rpc_sync(
            "bench1", _stamped, args=x)
        same_thread += thread == last_thread
        last_thread = thread
        end = time.perf_counter_ns()
        if previous is not None:  # the callee's reply stamps of a call come with the next one
            previous.update(reply_in=reply_in, reply_out=reply_out)
            calls.append(previous)
        previous = dict(start=start, call_in=_STAMPS["call_in"], call_out=_STAMPS["call_out"],
                        end=end, request_out=request_out, function=function)
    after = _wakeups(client)
    for name, first, last in _BREAKDOWN:
        rows[f"p50 {name}"] = statistics.median(c[last] - c[first] for c in calls) / 1e3
    for name in after:
        rows[f"per call: {name}"] = (after[name] - before[name]) / (len(calls) + 1)
    # Calls one after another run on the thread that served the one before (tpd_next_event
    # takes the ring back for it): their objects stay in one core's caches.
    rows["calls run on the callee's thread of the call before (%)"] = (
        100.0 * same_thread / (n // 2 - 1))
    # The daemon's share of the two ways (its histograms since it started, p50 within 25 %):
    # the rest of each way is the two clients' libraries and the hand-offs between threads.
    for stage in client.status().get("call_latency", []):
        if stage.get("stage") in ("local.deliver", "local.reply"):
            rows[f"daemon: {stage['stage']} p50 (whole run)"] = float(stage.get("p50_us", 0))
    return rows


def _wakeups(client):
    """Counts of sleeps and futex wake-ups on the calls' way: the daemon's, summed over both
    workers' sessions (Admin.Status), and the caller's library's own (tpd_call_stats)."""
    sessions = client.status().get("attached_sessions", [])
    stats = client.call_stats()
    return {
        "readers woken by the daemon (both workers)":
            sum(int(s.get("reader_wakeups", 0)) for s in sessions),
        "daemon's session threads slept (both workers)":
            sum(int(s.get("daemon_sleeps", 0)) for s in sessions),
        "caller's library: its reader slept": int(stats.get("reader_sleeps", 0)),
        "caller's library: hand-offs that woke a thread": int(stats.get("handoffs_woken", 0)),
    }


def _worker(rank, backend, init_method, socket_path, args, queue):
    os.environ["TPD_SOCKET"] = socket_path or ""
    os.environ["TPD_CUDA_POOL_BYTES"] = str(1 << 30)  # 256 MiB tensors, both ways
    import torch
    if backend == "tpd":
        import tpd.rpc as rpc
    else:
        import torch.distributed.rpc as rpc
    options = rpc.TensorPipeRpcBackendOptions(init_method=init_method, rpc_timeout=300,
                                              num_worker_threads=16)
    cuda = args.cuda
    if cuda:
        options.set_device_map("bench1" if rank == 0 else "bench0",
                               {0: 1} if rank == 0 else {1: 0})
    if args.breakdown:
        _stamp_library_calls()
    if backend == "TPD":
        import tpd.backend  # noqa: F401 (registers BackendType.TPD)
        rpc.init_rpc(f"bench{rank}", rank=rank, world_size=2, rpc_backend_options=options,
                     backend=rpc.BackendType.TPD)
    else:
        rpc.init_rpc(f"bench{rank}", rank=rank, world_size=2, rpc_backend_options=options)
    measure = _breakdown if args.breakdown else _measure
    rows = measure(rpc, torch, argparse.Namespace(**dict(vars(args), cuda=cuda))) \
        if rank == 0 else None
    rpc.shutdown()
    queue.put(rows) if rows is not None else None


def run_backend(backend, sockets, args):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    init = f"tcp://127.0.0.1:{_free_port()}"
    procs = [ctx.Process(target=_worker, args=(r, backend, init, sockets[r], args, queue))
             for r in range(2)]
    for p in procs:
        p.start()
    rows = queue.get(timeout=1800)
    for p in procs:
        p.join(timeout=120)
    return rows


def probe_callbacks(path, n=200000):
    import ctypes
    lib = ctypes.CDLL(path)
    callback_type = ctypes.CFUNCTYPE(None, ctypes.c_int64)
    for name in ("probe_native_thread", "probe_this_thread"):
        getattr(lib, name).restype = ctypes.c_int64
        getattr(lib, name).argtypes = [callback_type, ctypes.c_int64]
    callback = callback_type(lambda i: None)
    native = lib.probe_native_thread(callback, n) / n
    python_thread = lib.probe_this_thread(callback, n) / n
    print(f"P0 ctypes callback per call: from a native thread {native:.0f} ns, "
          f"from a Python thread {python_thread:.0f} ns ({native / python_thread:.1f}x)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--probe", help="bench/python/callback_probe.so: row P0 only")
    parser.add_argument("--breakdown", action="store_true",
                        help="where an empty call's time goes (tpd, one node)")
    parser.add_argument("--tpd", help="the tpd binary")
    parser.add_argument("--cuda", action="store_true", help="also CUDA tensors (two GPUs)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--p3_arena", action="store_true",
                        help="tpd.rpc's P3 tensors built by tpd.rpc.empty (in the arena: no copy "
                             "on the caller's side); torch's as before")
    parser.add_argument("--agent_channels",
                        help="the daemons' [agent] channels, comma-separated, e.g. mpt_uv,basic "
                             "(what two machines use: cma links processes of one host only)")
    parser.add_argument("--breakdown_kib", type=int, default=0,
                        help="--breakdown of a call echoing a tensor of this many KiB")
    parser.add_argument("--p3_kib", type=lambda text: [int(v) for v in text.split(",")],
                        default=[1 << 10, 16 << 10, 256 << 10],
                        help="P3's tensor sizes in KiB, comma-separated (default 1, 16, 256 MiB)")
    parser.add_argument("--backend", action="store_true",
                        help="also torch's RPC module with backend=TPD (needs tpd._C)")
    args = parser.parse_args()
    if args.probe:
        probe_callbacks(args.probe)
        return
    root = tempfile.mkdtemp(prefix="tpd-bench-", dir="/tmp")
    token = secrets.token_hex(8)
    # 1 GiB arenas: the 256 MiB tensors of P3 must fit (docs/python.md, "arena_bytes").
    extra = f"[data]\narena_bytes = {1 << 30}\n"
    if args.agent_channels:
        channels = ", ".join(f'"{c}"' for c in args.agent_channels.split(","))
        extra += f"[agent]\nchannels = [{channels}]\n"
    daemons = [Daemon(args.tpd, root, f"node{i}", token, extra) for i in range(2)]
    # Both daemons share this host on ports of their own: the job's group lives at node0's
    # (tpd.rpc would otherwise look for it on each worker's own daemon's port).
    from tpd._client import Client
    node0 = Client(daemons[0].socket)
    os.environ["TPD_RPC_HOME"] = "tcp://" + node0.status()["peer_address"]
    node0.close()
    if args.breakdown:
        try:
            rows = run_backend("tpd", [daemons[0].socket] * 2, args)
        finally:
            for d in daemons:
                d.stop()
            shutil.rmtree(root, ignore_errors=True)
        for row, value in rows.items():
            unit = "" if row.startswith(("per call", "calls run")) else " us"
            print(f"{row:64} {value:8.2f}{unit}")
        return
    try:
        results = {
            "torch": run_backend("torch", [None, None], args),
            "tpd.rpc 1 node": run_backend("tpd", [daemons[0].socket] * 2, args),
            "tpd.rpc 2 daemons": run_backend("tpd", [d.socket for d in daemons], args),
        }
        if args.backend:
            results["TPD 1 node"] = run_backend("TPD", [daemons[0].socket] * 2, args)
            results["TPD 2 daemons"] = run_backend("TPD", [d.socket for d in daemons], args)
    finally:
        for d in daemons:
            d.stop()
        shutil.rmtree(root, ignore_errors=True)
    # Each column's value, and torch's time over its (above 1: faster than torch).
    columns = [name for name in results if name != "torch"]
    print(f"{'row':46} {'torch':>9}" + "".join(f" {name:>17} {'ratio':>5}" for name in columns))
    for row, base in results["torch"].items():
        line = f"{row:46} {base:9.1f}"
        for name in columns:
            value = results[name].get(row)
            if value is None:
                line += f" {'-':>17} {'-':>5}"
                continue
            ratio = value / base if "calls/s" in row else base / value
            line += f" {value:17.1f} {ratio:5.2f}"
        print(line)


if __name__ == "__main__":
    main()
