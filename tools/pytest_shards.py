"""Runs pytest's cases in N processes at once: for torch's RPC suites on a machine with many
cores (each case spawns its ranks afresh and waits mostly on their imports, so a 32-core GPU
machine runs a dozen at a time).

    python3 tools/pytest_shards.py -n 12 [--log-dir DIR] -- tests/python/test_torch_backend.py -k Cuda

Collects the cases once (pytest --collect-only), deals them out round robin, runs one pytest
per share with the same arguments, and prints each share's summary line, the cases that did
not pass, and "N passed, N failed, N skipped" over all of them. Exits non-zero when a case
failed or a share ended abnormally. Each share's output is in DIR/shard-K.log.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile


def collect(pytest_args, root):
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider"] + pytest_args,
                          capture_output=True, text=True, cwd=root)
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    if done.returncode not in (0, 5) or not ids and done.returncode != 5:
        sys.exit(f"collecting failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return ids


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=os.cpu_count() or 1, help="processes at once")
    parser.add_argument("--log-dir", default=None)
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    pytest_args = [a for a in args.pytest_args if a != "--"]
    # Options stay (they apply to every share); paths and -k select what is collected only.
    options = [a for a in pytest_args if a.startswith("-") and a != "-k"]
    # Node ids are relative to pytest's rootdir, and read relative to the directory pytest
    # runs in: both the paths' common directory, for collecting and for running.
    paths = [os.path.abspath(a.split("::")[0]) for a in pytest_args
             if not a.startswith("-") and os.path.exists(a.split("::")[0])]
    root = os.path.commonpath([p if os.path.isdir(p) else os.path.dirname(p) for p in paths]
                              or [os.getcwd()])
    options.append(f"--rootdir={root}")
    pytest_args = [os.path.abspath(a) if os.path.exists(a.split("::")[0]) else a
                   for a in pytest_args] + [f"--rootdir={root}"]
    ids = collect(pytest_args, root)
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="pytest-shards-")
    os.makedirs(log_dir, exist_ok=True)
    shares = [ids[k::args.n] for k in range(min(args.n, len(ids)))]
    print(f"{len(ids)} cases in {len(shares)} shares; logs in {log_dir}", flush=True)
    running = []
    for k, share in enumerate(shares):
        log = open(os.path.join(log_dir, f"shard-{k}.log"), "w")
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs"]
        command += [o for o in options if o not in ("-q", "-x")] + share
        running.append((k, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                  cwd=root), log))
    totals = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    abnormal = False
    for k, process, log in running:
        code = process.wait()
        log.close()
        with open(log.name) as f:
            text = f.read()
        lines = text.strip().splitlines()
        summary = lines[-1] if lines else "(no output)"
        print(f"shard {k}: {summary}")
        for line in lines:
            if line.startswith(("FAILED", "ERROR")):
                print(f"  {line}")
        for count, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary):
            totals["error" if word.startswith("error") else word] += int(count)
        abnormal |= code not in (0, 1, 5)
    print(f"{totals['passed']} passed, {totals['failed'] + totals['error']} failed, "
          f"{totals['skipped']} skipped")
    sys.exit(1 if abnormal or totals["failed"] or totals["error"] else 0)


if __name__ == "__main__":
    main()
