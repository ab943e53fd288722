#!/usr/bin/env bash
# The checks .clang-tidy declares (function length, parameter count, STYLE.md's names), over
# the folders brought to them: client/ (issue 33), base/, cuda/ and shm/. Needs the generated
# headers of a build (bazel-bin: tools/test.sh runs this after its build). Names what differs;
# exits 1 if anything does.
#
#   tools/tidy.sh [FILE.cc...]     default: every .cc file of the folders below
set -uo pipefail
cd "$(dirname "$0")/.."

FOLDERS=(client base cuda shm)
if [[ $# -gt 0 ]]; then
  files=("$@")
else
  mapfile -t files < <(git ls-files "${FOLDERS[@]/%//*.cc}")
fi
# The include paths Bazel gives the compiler: the workspace, generated protobuf and gRPC
# headers, the CUDA toolkit's; everything else is under /usr/include.
flags=(-x c++ -std=c++17 -I. -Ibazel-bin -Ibazel-bin/bazel/grpc -I/usr/local/cuda/include)
if [[ ! -e bazel-bin/proto/control.pb.h ]]; then
  echo "tidy: no generated headers under bazel-bin: build first (bazel build //...)"
  exit 1
fi
# Two at a time: this machine has two cores.
found="$(printf '%s\n' "${files[@]}" |
  xargs -P 2 -I{} clang-tidy-14 --quiet {} -- "${flags[@]}" 2>&1 |
  grep -E '(warning|error):' | sort -u)"
if [[ -n "$found" ]]; then
  echo "$found"
  echo "tidy: the code above is off what .clang-tidy declares"
  exit 1
fi
echo "tidy: ${#files[@]} files pass .clang-tidy's checks (${FOLDERS[*]})"
