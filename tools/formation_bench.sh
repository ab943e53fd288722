#!/usr/bin/env bash
# The formation rows of docs/BENCHMARKS.md ("Formation through etcd beside one etcd put per
# rank"): starts a 1-member etcd (clients on 127.0.0.1:23790) and a 3-member cluster (24790-2)
# in a temporary directory, runs group_bench over daemon 0's peer port, the 1-member etcd and
# the 3-member cluster, RUNS times back to back, then stops the etcds.
#
#   tools/formation_bench.sh [RUNS]        here: builds //bench:group_bench, etcd from PATH
#
# On the GPU machine (no Bazel, no etcd): bundle group_bench, add Debian's etcd binary (a Go
# program needing only libc) and say where both are:
#   tools/device_bundle.sh -o .device-cuda //bench:group_bench && cp /usr/bin/etcd .device-cuda/bin/
#   # run (carry [".device-cuda"]):
#   GROUP_BENCH=".device-cuda/run group_bench" ETCD=.device-cuda/bin/etcd tools/formation_bench.sh 2
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-2}
etcd=${ETCD:-etcd}
if [[ -z ${GROUP_BENCH:-} ]]; then
  bazel build -c opt //bench:group_bench
  GROUP_BENCH="$(bazel info -c opt bazel-bin 2>/dev/null)/bench/group_bench"
fi
ulimit -n "$(ulimit -Hn)"  # every rank is a unix connection, both ends in group_bench

dir=$(mktemp -d)
pids=()
stop() {
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap stop EXIT
"$etcd" --name s --data-dir "$dir/s" --listen-client-urls http://127.0.0.1:23790 \
  --advertise-client-urls http://127.0.0.1:23790 --listen-peer-urls http://127.0.0.1:23800 \
  --initial-advertise-peer-urls http://127.0.0.1:23800 \
  --initial-cluster s=http://127.0.0.1:23800 >"$dir/s.log" 2>&1 &
pids+=($!)
cluster="m0=http://127.0.0.1:24800,m1=http://127.0.0.1:24801,m2=http://127.0.0.1:24802"
for i in 0 1 2; do
  "$etcd" --name "m$i" --data-dir "$dir/m$i" --listen-client-urls "http://127.0.0.1:2479$i" \
    --advertise-client-urls "http://127.0.0.1:2479$i" --listen-peer-urls "http://127.0.0.1:2480$i" \
    --initial-advertise-peer-urls "http://127.0.0.1:2480$i" --initial-cluster "$cluster" \
    --initial-cluster-state new >"$dir/m$i.log" 2>&1 &
  pids+=($!)
done
sleep 4  # the cluster elects a leader

common=(--ranks=1000,4000 --daemons=4 --omit_members)
for run in $(seq "$runs"); do
  echo "== run $run: daemon 0's peer port"
  $GROUP_BENCH "${common[@]}"
  echo "== run $run: etcd, 1 member"
  $GROUP_BENCH "${common[@]}" --init_method="etcd://127.0.0.1:23790/bench$run"
  echo "== run $run: etcd, 3 members"
  $GROUP_BENCH "${common[@]}" \
    --init_method="etcd://127.0.0.1:24790,127.0.0.1:24791,127.0.0.1:24792/bench$run"
done
