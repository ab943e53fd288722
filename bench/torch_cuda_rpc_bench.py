#!/usr/bin/env python3
"""B6 peer: torch.distributed.rpc (TensorPipe) moving CUDA tensors cuda:0 -> cuda:1 by a device map.

Two parts, so that tpd's B6 rows have both a floor and a competitor beside them:

* Raw copies in this process (no rpc): d2d (cuda:0 -> cuda:0), peer (cuda:0 -> cuda:1, and
  peer_1to0 back, which the echo's reply needs), h2d_pinned and d2h_pinned (pinned host <->
  cuda:0). Each copy is bracketed by CUDA events on the stream it runs on and synchronized
  alone, so seconds_p50 is the GPU's time for one copy; wall_seconds_p50 adds the launch and
  the synchronization as the host sees them (what a 4 KiB call pays at least). GB/s = bytes /
  seconds_p50 / 1e9. These are the targets of docs/cuda.md (>= 0.9x peer at 256 MiB for the
  same-node path, >= 0.8x pinned H2D/D2H for the staged one).
* torch rpc: two spawned processes, rank 0 "caller" (cuda:0, device map {0: 1} to "callee")
  and rank 1 "callee" (cuda:1), one rpc_sync at a time in a closed loop.
  - oneway: the callee gets the tensor on cuda:1 and answers its numel (an int, so the reply
    carries no tensor and needs no map). TensorPipe's CUDA channels hand the tensor to the
    function once the copy is *enqueued* on the receive stream, not finished, so the callee
    synchronizes that stream before answering: the round trip then covers the bytes landing,
    as tpd's does (it posts the message when its copy completed).
  - echo: the callee returns the tensor; torch maps the reply cuda:1 -> cuda:0 by the reverse
    of the caller's map, and the caller synchronizes its stream after rpc_sync, since
    rpc_sync only orders the reply's copy before later work on that stream.
  Each size is checked once (device of arrival, checksum of all bytes, first and last 64
  bytes; for echo the reply's device and torch.equal), then warmed up, then timed. GB/s =
  bytes of the tensor / p50 round trip, counted once in both modes (as torch_rpc_bench and
  relay_bench count them).

    python3 bench/torch_cuda_rpc_bench.py --sizes 0,4096,1048576,67108864,268435456 \\
        [--iters N] [--modes oneway,echo] [--channels cuda_ipc,...] [--out results.json]

Without --iters: 50 iterations up to 1 MiB, 20 up to 64 MiB, 10 above. Output: markdown tables
on stdout, progress on stderr, and with --out JSON:
{"machine": {...}, "raw": [{"name", "bytes", "iters", "seconds_p50", "wall_seconds_p50",
"gbps"}], "torch_rpc": [{"mode", "bytes", "iters", "p50_us", "p90_us", "mean_us", "gbps"}],
"skipped": [reasons], "error": message or null}; a torch_rpc row that failed has "error" in
place of the numbers and the other sizes still run. Fewer than two GPUs: raw d2d/h2d/d2h only.
Any failure in the rpc part still prints and writes what was measured, then exits non-zero.
"""

import argparse
import contextlib
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp

MIB = 1 << 20
UNITS = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text):
    """'4096', '4KiB', '64MiB' -> bytes."""
    s = text.strip().lower()
    for unit in sorted(UNITS, key=len, reverse=True):
        if s.endswith(unit):
            return int(s[: -len(unit)]) * UNITS[unit]
    return int(s)


def size_name(nbytes):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def default_iters(nbytes):
    if nbytes <= MIB:
        return 50
    if nbytes <= 64 * MIB:
        return 20
    return 10


def warmups(nbytes):
    # Enough for the first-use costs (peer enablement, IPC handle caches, allocator growth)
    # to leave the measured window without spending long at 256 MiB.
    return 5 if nbytes <= MIB else 2


def pattern(nbytes, device):
    # A period of 251 (prime, not a power of two): a shifted, truncated or stale copy changes
    # the checksum or the edge bytes, where a constant fill would not.
    return (torch.arange(nbytes, dtype=torch.int64, device=device) % 251).to(torch.uint8)


def checksum(t):
    """Sum of all bytes plus the first and last 64: cheap on the GPU, and catches a copy that
    moved the wrong range as well as one that did not land."""
    return (int(t.sum(dtype=torch.int64)), t[:64].tolist(), t[-64:].tolist())


def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9 if nbytes and seconds > 0 else None


def percentile(sorted_values, p):
    return sorted_values[int(p * (len(sorted_values) - 1))]


# ---------------------------------------------------------------------------------------------
# Raw copies (this process, no rpc)


def sync_all():
    # torch.cuda.synchronize() waits for the current device only; the peer rows use both.
    for i in range(torch.cuda.device_count()):
        torch.cuda.synchronize(i)


def time_copy(copy, stream, n, warm):
    """Median GPU seconds (events around the copy on `stream`) and median wall seconds."""
    for _ in range(warm):
        copy()
    sync_all()
    gpu, wall = [], []
    for _ in range(n):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record(stream)
        copy()
        end.record(stream)
        # One copy at a time, like the rpc loop: nothing of the next copy overlaps this one.
        end.synchronize()
        wall.append(time.perf_counter() - t0)
        gpu.append(start.elapsed_time(end) / 1e3)
    return statistics.median(gpu), statistics.median(wall)


def raw_baselines(sizes, iters, two_gpus):
    rows = []
    d0 = torch.device("cuda", 0)
    d1 = torch.device("cuda", 1) if two_gpus else None
    for nbytes in sizes:
        if nbytes == 0:
            continue  # no bytes, no bandwidth: the rpc part covers the empty call
        n = iters or default_iters(nbytes)
        warm = warmups(nbytes)
        src = pattern(nbytes, d0)
        dst = torch.empty_like(src)
        host_in = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        host_in.copy_(src)
        host_out = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        s0 = torch.cuda.current_stream(d0)
        # (name, copy, stream it runs on, destination, what the destination must equal). The
        # destination is zeroed first: the caching allocators (pinned host ones included, which
        # empty_cache leaves alone) may hand back a block that still holds this very pattern.
        cases = [("d2d", lambda: dst.copy_(src), s0, dst, src)]
        if two_gpus:
            on1 = torch.empty(nbytes, dtype=torch.uint8, device=d1)
            back = torch.empty_like(src)
            # A copy between devices runs on the *source* device's current stream (the
            # destination's stream is made to wait on it), so that is where the events go.
            # peer_1to0 reads what peer wrote, so it must come after it.
            cases += [
                ("peer", lambda: on1.copy_(src), s0, on1, src),
                ("peer_1to0", lambda: back.copy_(on1), torch.cuda.current_stream(d1), back, src),
            ]
        cases += [
            # non_blocking from/to pinned memory is a true async DMA (cudaMemcpyAsync); from
            # pageable memory torch would stage through a bounce buffer and time that instead.
            ("h2d_pinned", lambda: dst.copy_(host_in, non_blocking=True), s0, dst, src),
            ("d2h_pinned", lambda: host_out.copy_(src, non_blocking=True), s0, host_out, host_in),
        ]
        for name, copy, stream, out, want in cases:
            out.zero_()
            sync_all()
            seconds, wall = time_copy(copy, stream, n, warm)
            sync_all()
            if not torch.equal(out.to(want.device), want):
                raise RuntimeError(f"raw {name} {size_name(nbytes)}: the copy came out wrong")
            rows.append(dict(name=name, bytes=nbytes, iters=n, seconds_p50=seconds,
                             wall_seconds_p50=wall, gbps=gbps(nbytes, seconds)))
            print(f"  raw {name:10s} {size_name(nbytes):>7s} {seconds * 1e6:10.1f} us "
                  f"{rows[-1]['gbps']:8.2f} GB/s", file=sys.stderr, flush=True)
        del src, dst, host_in, host_out, cases
        if two_gpus:
            del on1, back
        torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------------------------------------
# torch rpc (two spawned processes). The functions the callee runs are module-level so that
# rpc can pickle them by name.


def check(t):
    # .tolist() and int() wait for the receive stream, which is current while the function runs.
    return t.device.type, t.device.index, t.numel(), checksum(t)


def deliver(t):
    # The CUDA channel enqueued the copy and called us; answering now would time the enqueue,
    # not the bytes. Wait for the receive stream (the current one here) to finish.
    torch.cuda.current_stream(t.device).synchronize()
    return t.numel()


def echo(t):
    return t


def backend_options(args):
    kwargs = dict(num_worker_threads=16, rpc_timeout=args.rpc_timeout,
                  init_method=args.init_method)
    if args.transports:
        kwargs["_transports"] = args.transports.split(",")
    if args.channels:
        kwargs["_channels"] = args.channels.split(",")
    return rpc.TensorPipeRpcBackendOptions(**kwargs)


def time_rpc(t, nbytes, mode, n, warm):
    """One row: `n` closed-loop round trips of `t` in `mode` after `warm` unmeasured ones."""
    dev = t.device
    fn = deliver if mode == "oneway" else echo

    def once():
        t0 = time.perf_counter_ns()
        reply = rpc.rpc_sync("callee", fn, args=(t,))
        if mode == "echo":
            # rpc_sync made the current stream wait for the reply's copy; wait for it on the
            # host too, or the loop would time the enqueue.
            torch.cuda.current_stream(dev).synchronize()
        return (time.perf_counter_ns() - t0) / 1e3, reply

    for i in range(warm):
        _, reply = once()
        if i == 0:
            if mode == "oneway":
                ok = reply == nbytes
            else:
                ok = reply.device == dev and torch.equal(reply, t)
            if not ok:
                raise RuntimeError(f"{mode} {size_name(nbytes)}: the reply came back wrong")
        del reply
    us = [once()[0] for _ in range(n)]
    mean = statistics.fmean(us)
    us.sort()
    p50, p90 = percentile(us, 0.5), percentile(us, 0.9)
    return dict(mode=mode, bytes=nbytes, iters=n, p50_us=p50, p90_us=p90, mean_us=mean,
                gbps=gbps(nbytes, p50 / 1e6))


def run_caller(args):
    dev = torch.device("cuda", 0)
    rows = []
    for nbytes in args.sizes:
        n = args.iters or default_iters(nbytes)
        t = pattern(nbytes, dev)
        torch.cuda.synchronize(dev)
        # A failed size becomes an error row and the next size still runs: one GPU session
        # should not lose the 256 MiB row to, say, a torch quirk with empty CUDA tensors. The
        # parent exits non-zero when any row has an error.
        try:
            want = ("cuda", 1, nbytes, checksum(t))
            got = tuple(rpc.rpc_sync("callee", check, args=(t,)))
            if got != want:
                raise RuntimeError(
                    f"{size_name(nbytes)}: the callee got {got[:3]} with checksum {got[3][0]}, "
                    f"expected {want[:3]} with checksum {want[3][0]} "
                    f"(edge bytes equal: {got[3][1:] == want[3][1:]})")
        except Exception as e:
            rows += [dict(mode=m, bytes=nbytes, error=f"{type(e).__name__}: {e}")
                     for m in args.modes]
            print(f"  rpc {size_name(nbytes):>7s} failed: {e}", file=sys.stderr, flush=True)
            continue
        for mode in args.modes:
            try:
                rows.append(time_rpc(t, nbytes, mode, n, warmups(nbytes)))
                print(f"  rpc {mode:6s} {size_name(nbytes):>7s} p50 {rows[-1]['p50_us']:10.1f} us",
                      file=sys.stderr, flush=True)
            except Exception as e:
                rows.append(dict(mode=mode, bytes=nbytes, error=f"{type(e).__name__}: {e}"))
                print(f"  rpc {mode:6s} {size_name(nbytes):>7s} failed: {e}", file=sys.stderr,
                      flush=True)
        del t
        torch.cuda.empty_cache()
    return rows


def rpc_worker(rank, args, result_path):
    """Entry of both spawned processes (torch.multiprocessing passes the rank first)."""
    torch.set_num_threads(1)
    # Each process works on its own GPU by default, so nothing lands on the other by accident
    # (and the callee builds no context on cuda:0 that it does not need).
    torch.cuda.set_device(rank)
    options = backend_options(args)
    if rank == 1:
        # The callee's devices (cuda:1) and the reverse map for echo replies are inferred from
        # the caller's map when the agents exchange them at init.
        rpc.init_rpc("callee", rank=1, world_size=2, rpc_backend_options=options)
        rpc.shutdown()  # graceful: waits for the caller's shutdown
        return
    options.set_device_map("callee", {0: 1})
    rpc.init_rpc("caller", rank=0, world_size=2, rpc_backend_options=options)
    try:
        rows = run_caller(args)
    except BaseException:
        # A graceful shutdown would wait on a peer that may be the reason we failed; drop the
        # agent and let the exception reach the parent (the launcher ends the callee).
        with contextlib.suppress(Exception):
            rpc.shutdown(graceful=False)
        raise
    rpc.shutdown()
    with open(result_path, "w") as f:
        json.dump(rows, f)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_rpc(args):
    """Runs the two rpc processes under one deadline; returns their rows or raises."""
    args.init_method = f"tcp://127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory(prefix="torch_cuda_rpc_bench.") as tmp:
        result_path = os.path.join(tmp, "rows.json")
        ctx = mp.start_processes(rpc_worker, args=(args, result_path), nprocs=2, join=False,
                                 start_method="spawn")
        deadline = time.monotonic() + args.timeout
        try:
            # join() raises ProcessRaisedException (with the child's traceback) or
            # ProcessExitedException when a child fails, and ends the other one.
            while not ctx.join(timeout=1):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the rpc part ran past --timeout={args.timeout} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join(timeout=10)
        with open(result_path) as f:
            return json.load(f)


# ---------------------------------------------------------------------------------------------


def driver_version():
    # torch does not expose the driver's version; nvidia-smi does, when it is installed.
    with contextlib.suppress(Exception):
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.splitlines()[0].strip()
    return None


def machine_info(args, count):
    info = dict(
        host=socket.gethostname(), cpus=os.cpu_count(), python=platform.python_version(),
        torch=torch.__version__, cuda=torch.version.cuda, driver=driver_version(),
        gpu_count=count,
        gpus=[dict(index=i, name=torch.cuda.get_device_name(i),
                   memory_bytes=torch.cuda.get_device_properties(i).total_memory)
              for i in range(count)],
        transports=args.transports or "default", channels=args.channels or "default",
        rpc_timeout_s=args.rpc_timeout,
    )
    if count >= 2:
        info["peer_access_0_to_1"] = torch.cuda.can_device_access_peer(0, 1)
        info["peer_access_1_to_0"] = torch.cuda.can_device_access_peer(1, 0)
    return info


def print_tables(machine, raw, rows, skipped):
    gpus = ", ".join(g["name"] for g in machine["gpus"])
    print(f"# torch_cuda_rpc_bench: host {machine['host']}, torch {machine['torch']}, "
          f"CUDA {machine['cuda']}, driver {machine['driver']}, GPUs: {gpus}")
    if "peer_access_0_to_1" in machine:
        print(f"# peer access 0->1 {machine['peer_access_0_to_1']}, "
              f"1->0 {machine['peer_access_1_to_0']}")
    for reason in skipped:
        print(f"# skipped: {reason}")
    print()
    print("| copy | size | GPU µs p50 | wall µs p50 | GB/s |")
    print("|---|---|---|---|---|")
    for r in raw:
        print(f"| {r['name']} | {size_name(r['bytes'])} | {r['seconds_p50'] * 1e6:.1f} | "
              f"{r['wall_seconds_p50'] * 1e6:.1f} | {r['gbps']:.2f} |")
    if not rows:
        return
    peer = {r["bytes"]: r["gbps"] for r in raw if r["name"] == "peer"}
    print()
    print("| torch rpc | size | p50 µs | p90 µs | mean µs | GB/s | x raw peer |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if r.get("error"):
            print(f"| {r['mode']} | {size_name(r['bytes'])} | failed: {r['error']} | | | | |")
            continue
        g = f"{r['gbps']:.2f}" if r["gbps"] is not None else "-"
        ratio = f"{r['gbps'] / peer[r['bytes']]:.2f}" if r["gbps"] and peer.get(r["bytes"]) else "-"
        print(f"| {r['mode']} | {size_name(r['bytes'])} | {r['p50_us']:.1f} | {r['p90_us']:.1f} | "
              f"{r['mean_us']:.1f} | {g} | {ratio} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0,4096,1048576,67108864,268435456",
                        help="comma-separated byte counts (4096, 4KiB, 64MiB, ...)")
    parser.add_argument("--iters", type=int, default=0,
                        help="measured iterations per row (default: 50 <= 1 MiB, 20 <= 64 MiB, "
                             "10 above)")
    parser.add_argument("--modes", default="oneway,echo", help="rpc modes: oneway, echo")
    parser.add_argument("--out", default="", help="write the results as JSON to this file")
    parser.add_argument("--rpc-timeout", type=float, default=120,
                        help="seconds for one rpc (and for the agents' rendezvous)")
    parser.add_argument("--timeout", type=float, default=900,
                        help="seconds for the whole rpc part, spawn to shutdown")
    parser.add_argument("--transports", default="", help="e.g. shm,uv (default: torch's)")
    parser.add_argument("--channels", default="",
                        help="e.g. cuda_ipc or cuda_basic,basic (default: torch's)")
    parser.add_argument("--skip-raw", action="store_true", help="only the rpc part")
    parser.add_argument("--skip-rpc", action="store_true", help="only the raw copies")
    args = parser.parse_args()
    args.sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in args.modes:
        if m not in ("oneway", "echo"):
            parser.error(f"unknown mode {m!r} (oneway, echo)")
    if args.iters < 0:
        parser.error("--iters must be >= 1 (0 or absent: the per-size default)")

    if not torch.cuda.is_available():
        sys.exit("torch_cuda_rpc_bench: no CUDA device visible to torch, nothing to measure")
    count = torch.cuda.device_count()
    machine = machine_info(args, count)
    skipped = []
    two_gpus = count >= 2
    if not two_gpus:
        reason = (f"{count} GPU visible: the peer copies and the torch rpc part need cuda:0 and "
                  f"cuda:1")
        skipped.append(reason)
        print(f"torch_cuda_rpc_bench: {reason}; measuring d2d/h2d/d2h only", file=sys.stderr)
    elif not machine["peer_access_0_to_1"]:
        # Still measured: then the driver stages the "peer" copy through the host, and the row
        # says so, which is what torch rpc would get on this machine too.
        print("torch_cuda_rpc_bench: cuda:0 cannot access cuda:1 as a peer; the peer rows are "
              "staged by the driver", file=sys.stderr)

    raw = []
    if not args.skip_raw:
        raw = raw_baselines(args.sizes, args.iters, two_gpus)
        sync_all()
        torch.cuda.empty_cache()  # leave the GPUs' memory to the rpc processes

    rows, error = [], None
    if args.skip_rpc:
        skipped.append("torch rpc: --skip-rpc")
    elif two_gpus:
        try:
            rows = torch_rpc(args)
        except (mp.ProcessRaisedException, mp.ProcessExitedException, TimeoutError,
                OSError, ValueError) as e:
            error = f"torch rpc part failed: {e}"
        failed = [r for r in rows if r.get("error")]
        if failed and not error:
            error = f"{len(failed)} torch rpc row(s) failed, first: {failed[0]['error']}"

    print_tables(machine, raw, rows, skipped)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(machine=machine, raw=raw, torch_rpc=rows, skipped=skipped,
                           error=error), f, indent=2)
            f.write("\n")
    if error:
        sys.exit(f"torch_cuda_rpc_bench: {error}")


if __name__ == "__main__":
    main()
