#!/usr/bin/env python3
"""B7 peer for B3: torch.distributed.rpc (TensorPipe backend) echo of CPU tensors.

Two processes on one host (this one, rank 0 "caller", and a spawned rank 1 "callee"); the
caller does rpc_sync(callee, echo, (tensors,)) one call at a time in a closed loop and the
callee returns what it received, so the tensors go there and back, as in relay_bench. Sizes
and iteration counts are relay_bench's: 0 B (a call with no arguments that returns None: the
smallest call torch rpc can make), 64 B .. 256 MiB as one uint8 tensor, 64 x 1 MiB and 4096 x
16 KiB as lists of tensors (1 GiB with --gib). Warm-up first; p50/p90/p99 of the round trip;
GB/s = bytes of the tensors / p50 round trip (1e9 B/s, counted once, as relay_bench counts
them); minor page faults and CPU time (user + system) of both processes per measured call.

    python3 bench/torch_rpc_bench.py [--scale=1] [--gib] [--tsv=/tmp/torch_rpc.tsv]

Output: a markdown table on stdout and, with --tsv, relay_bench's TSV columns (bench
"torch_rpc", kind "cpu"). The backend runs with its defaults (on one host TensorPipe offers
shm and uv, cma and basic among others, and picks by its own priorities); --transports and
--channels restrict them (TensorPipeRpcBackendOptions' _transports/_channels).
"""

import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp

MIB = 1 << 20
CASES = [
    ("0B", 0, 0),
    ("64B", 64, 1),
    ("4KiB", 4 << 10, 1),
    ("64KiB", 64 << 10, 1),
    ("1MiB", MIB, 1),
    ("2MiB", 2 * MIB, 1),
    ("8MiB", 8 * MIB, 1),
    ("16MiB", 16 * MIB, 1),
    ("64MiB", 64 * MIB, 1),
    ("256MiB", 256 * MIB, 1),
    ("64x1MiB", MIB, 64),
    ("4096x16KiB", 16 << 10, 4096),
]


def noop():
    return None


def echo(tensors):
    return tensors


def iterations(nbytes, scale):
    # relay_bench's counts, so both see the same number of calls per row.
    if nbytes <= 4096:
        n = 2000
    elif nbytes <= 65536:
        n = 1000
    elif nbytes <= MIB:
        n = 200
    elif nbytes <= 2 * MIB:
        n = 120
    elif nbytes <= 8 * MIB:
        n = 40
    elif nbytes <= 64 * MIB:
        n = 12
    elif nbytes <= 256 * MIB:
        n = 8
    else:
        n = 4
    n = int(n * scale)
    return max(4, (n + 3) // 4 * 4)


def percentile(sorted_us, p):
    return sorted_us[int(p * (len(sorted_us) - 1))]


def proc_cost(pids):
    """Minor faults and CPU µs (user + system) of `pids`, from /proc/PID/stat."""
    faults, cpu = 0.0, 0.0
    tick_us = 1e6 / os.sysconf("SC_CLK_TCK")
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        faults += float(fields[7])
        cpu += (float(fields[11]) + float(fields[12])) * tick_us
    return faults, cpu


def options(args):
    kwargs = dict(num_worker_threads=16, rpc_timeout=600, init_method=args.init_method)
    if args.transports:
        kwargs["_transports"] = args.transports.split(",")
    if args.channels:
        kwargs["_channels"] = args.channels.split(",")
    return rpc.TensorPipeRpcBackendOptions(**kwargs)


def callee(args):
    torch.set_num_threads(1)
    rpc.init_rpc("callee", rank=1, world_size=2, rpc_backend_options=options(args))
    rpc.shutdown()  # waits for the caller's shutdown


def caller(args, peer_pid):
    torch.set_num_threads(1)
    rpc.init_rpc("caller", rank=0, world_size=2, rpc_backend_options=options(args))
    cases = list(CASES)
    if args.gib:
        cases.insert(len(cases) - 2, ("1GiB", 1 << 30, 1))
    if args.sizes:
        wanted = args.sizes.split(",")
        cases = [c for c in cases if c[0] in wanted]
    rows = []
    for name, size, count in cases:
        n = iterations(size * count, args.scale)
        tensors = [torch.full((size,), (65 + i) % 256, dtype=torch.uint8) for i in range(count)]

        def once():
            if count == 0:
                t0 = time.perf_counter_ns()
                rpc.rpc_sync("callee", noop)
                return (time.perf_counter_ns() - t0) / 1e3, None
            t0 = time.perf_counter_ns()
            reply = rpc.rpc_sync("callee", echo, args=(tensors,))
            return (time.perf_counter_ns() - t0) / 1e3, reply

        for i in range(max(2, min(n // 4, 20))):
            _, reply = once()
            if i == 0 and count > 0:
                ok = len(reply) == count and all(torch.equal(a, b) for a, b in zip(reply, tensors))
                if not ok:
                    sys.exit(f"{name}: the echo came back wrong")
        f0, c0 = proc_cost([os.getpid(), peer_pid])
        us = sorted(once()[0] for _ in range(n))
        f1, c1 = proc_cost([os.getpid(), peer_pid])
        faults, cpu = (f1 - f0) / n, (c1 - c0) / n
        p50, p90, p99 = (percentile(us, p) for p in (0.5, 0.9, 0.99))
        nbytes = size * count
        gbps = nbytes / (p50 * 1e3) if nbytes else None
        rows.append((name, nbytes, count, n, p50, p90, p99, gbps, faults, cpu))
        print(f"  {name:8s} torch rpc p50 {p50:10.1f} us", file=sys.stderr, flush=True)
    rpc.shutdown()

    host = socket.gethostname()
    cpus = os.cpu_count()
    transports = args.transports or "default"
    channels = args.channels or "default"
    print(f"# torch_rpc_bench: host {host}, {cpus} cpus, torch {torch.__version__}, "
          f"TensorPipe transports {transports}, channels {channels}")
    print("| size | torch rpc p50 µs | p90 | p99 | GB/s | minor faults per call "
          "| cpu µs per call |")
    print("|---|---|---|---|---|---|---|")
    for name, nbytes, count, n, p50, p90, p99, gbps, faults, cpu in rows:
        g = f"{gbps:.2f}" if gbps is not None else "-"
        print(f"| {name} | {p50:.1f} | {p90:.1f} | {p99:.1f} | {g} | {faults:.1f} | {cpu:.0f} |")
    if args.tsv:
        with open(args.tsv, "w") as f:
            f.write(f"# torch_rpc_bench host={host} cpus={cpus} torch={torch.__version__} "
                    f"transports={transports} channels={channels}\n")
            f.write("bench\tkind\tsize\tbytes\ttensors\titerations\tp50_us\tp90_us\tp99_us\tgbps\t"
                    "ratio_p50_vs_raw\tfwd_p50_us\tback_p50_us\tminor_faults_per_call\t"
                    "cpu_us_per_call\n")
            for name, nbytes, count, n, p50, p90, p99, gbps, faults, cpu in rows:
                g = f"{gbps:.3f}" if gbps is not None else "-"
                f.write(f"torch_rpc\tcpu\t{name}\t{nbytes}\t{count}\t{n}\t{p50:.1f}\t{p90:.1f}\t"
                        f"{p99:.1f}\t{g}\t-\t-\t-\t{faults:.1f}\t{cpu:.0f}\n")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies iteration counts")
    parser.add_argument("--gib", action="store_true", help="add a 1 GiB row")
    parser.add_argument("--sizes", default="", help="comma-separated row names (e.g. 0B,1MiB)")
    parser.add_argument("--tsv", default="", help="also write the rows as TSV to this file")
    parser.add_argument("--transports", default="", help="e.g. shm,uv (default: torch's)")
    parser.add_argument("--channels", default="", help="e.g. cma,basic (default: torch's)")
    args = parser.parse_args()
    args.init_method = f"tcp://127.0.0.1:{free_port()}"
    ctx = mp.get_context("spawn")
    peer = ctx.Process(target=callee, args=(args,))
    peer.start()
    try:
        caller(args, peer.pid)
    finally:
        peer.join(timeout=60)
        if peer.is_alive():
            peer.kill()


if __name__ == "__main__":
    main()
