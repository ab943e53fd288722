"""Runs pytest's cases in N processes at once: for torch's RPC suites on a machine with many
cores (each case spawns its ranks afresh and waits mostly on their imports, so a 32-core GPU
machine runs a dozen at a time).

    python3 tools/pytest_shards.py -n 12 [--log-dir DIR] [--deadline S] -- \
        tests/python/test_torch_backend.py -k Cuda

Collects the cases once (pytest --collect-only), deals them out round robin, runs one pytest
per share with the same arguments, and prints the cases that did not pass and "N passed,
N failed, N skipped" over all of them. With --deadline, shares still running after S seconds
are stopped and the cases they had not finished are counted as such (a machine lent for a
while still reports what it ran). Exits non-zero when a case failed, did not finish, or a
share ended abnormally. Each share's output is in DIR/shard-K.log.
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

# pytest -v's line for a case: "test_x.py::Class::test_y PASSED    [ 10%]".
_OUTCOME = re.compile(r"^(\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)")


def collect(pytest_args, root):
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider"] + pytest_args,
                          capture_output=True, text=True, cwd=root)
    if done.returncode == 5:  # nothing collected
        return []
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    if done.returncode != 0 or not ids:
        sys.exit(f"collecting failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return ids


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=os.cpu_count() or 1, help="processes at once")
    parser.add_argument("--log-dir", default=None)
    parser.add_argument("--deadline", type=float, default=None,
                        help="stop the shares still running after this many seconds")
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
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-rfEs"]
        command += [o for o in options if o not in ("-q", "-v", "-x")] + share
        # A session of its own: a share stopped at the deadline takes its daemons and ranks.
        running.append((k, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                            cwd=root, start_new_session=True), log, share))
    deadline = time.monotonic() + args.deadline if args.deadline else None
    outcomes = {}
    abnormal = False
    for k, process, log, share in running:
        try:
            code = process.wait(timeout=None if deadline is None
                                else max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            code = process.wait()
        log.close()
        with open(log.name) as f:
            for line in f:
                match = _OUTCOME.match(line)
                if match:
                    outcomes[match.group(1)] = match.group(2)
        abnormal |= code not in (0, 1, 5)
    counts = {}
    for case in ids:
        outcome = outcomes.get(case, "NOT FINISHED")
        counts[outcome] = counts.get(outcome, 0) + 1
        if outcome not in ("PASSED", "SKIPPED", "XFAIL"):
            print(f"  {outcome} {case}")
    failed = counts.get("FAILED", 0) + counts.get("ERROR", 0)
    print(f"{counts.get('PASSED', 0)} passed, {failed} failed, {counts.get('SKIPPED', 0)} "
          f"skipped, {counts.get('NOT FINISHED', 0)} not finished")
    sys.exit(1 if abnormal or failed or counts.get("NOT FINISHED") else 0)


if __name__ == "__main__":
    main()
