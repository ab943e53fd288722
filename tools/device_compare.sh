#!/usr/bin/env bash
# Packs two bundles of tools/device_bundle.sh, built from two commits with the same targets,
# into one folder for the GPU machine (the `run` tool carries at most 64 MiB: their libraries
# go once, so they must list the same ones), with bench/compare_builds.sh to run there.
#
#   git checkout BASE && tools/device_bundle.sh -o .device-base //daemon:tpd //bench:call_bench \
#       //bench:relay_bench //bench:agent_bench //bench:cuda_bench
#   git checkout main && tools/device_bundle.sh -o .device-new  (same targets)
#   tools/device_compare.sh .device-base .device-new          # -> .device-cmp
#   # run (kind nvidia-h100-x2, carry [".device-cmp"]):
#   .device-cmp/compare_builds.sh local; .device-cmp/compare_builds.sh remote
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -lt 2 ]]; then
  echo "usage: $0 BASE_BUNDLE NEW_BUNDLE [OUT]   (OUT: .device-cmp)" >&2
  exit 2
fi
base=$1 new=$2 out=${3:-.device-cmp}
if ! diff -q <(ls "$base/lib") <(ls "$new/lib") >/dev/null; then
  echo "$base and $new carry different libraries: bundle both from the same targets" >&2
  exit 1
fi
rm -rf "$out"
mkdir -p "$out/base" "$out/new"
cp -r "$new/lib" "$out/lib"
cp -r "$base/bin" "$out/base/bin"
cp -r "$new/bin" "$out/new/bin"
cp bench/compare_builds.sh "$out/"
size=$(du -sm "$out" | cut -f1)
echo "bundle $out: base $(ls "$base/bin" | wc -l) and new $(ls "$new/bin" | wc -l) binaries, ${size} MiB"
if ((size > 60)); then
  echo "$out is over 60 MiB: the run tool carries at most 64 MiB" >&2
  exit 1
fi
