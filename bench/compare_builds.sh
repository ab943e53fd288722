#!/usr/bin/env bash
# Runs on the GPU machine, from a folder tools/device_compare.sh packed: two builds of the
# benchmarks (base/ and new/, sharing lib/) alternated in one call, base new base new, so that
# their rows differ only by the build and the run-to-run spread shows beside the change.
#
#   compare_builds.sh local    B2 (call_bench) and B6 on one node (cuda_bench): the router
#   compare_builds.sh remote   B3 (relay_bench), B6 across daemons, B1 (agent_bench): the agent
#
# Each benchmark's output goes to $OUT/<bench>.<build>.<part><round>.txt (OUT: /tmp/out); the
# rows are printed too.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$here/lib"
OUT=${OUT:-/tmp/out}
part=${1:-local}
mkdir -p "$OUT"
run() {  # lines build bench args...
  local lines=$1 build=$2 bench=$3
  shift 3
  timeout 200 "$here/$build/bin/$bench" "$@" >"$OUT/$bench.$build.$part$round.txt" 2>&1
  grep -v "^\[20" "$OUT/$bench.$build.$part$round.txt" | tail -"$lines"
}
for round in 1 2; do
  for build in base new; do
    if [[ $part == local ]]; then
      echo "== B2 $build $round"
      run 8 "$build" call_bench --calls=20000 --tensor_calls=500
      echo "== B6 $build $round"
      run 10 "$build" cuda_bench --iters 20 --sizes=4096,1048576,67108864,268435456
    else
      echo "== B3 $build $round"
      run 12 "$build" relay_bench --tpd="$here/$build/bin/tpd" --sizes=0B,64B,1MiB,16MiB
      echo "== B6 remote $build $round"
      run 8 "$build" cuda_bench --remote --iters 10 --sizes=4096,1048576,67108864
      if [[ $round == 1 ]]; then
        echo "== B1 $build"
        run 14 "$build" agent_bench --pairs=uv+cma,uv+mpt_uv --scale=0.5
      fi
    fi
  done
done
