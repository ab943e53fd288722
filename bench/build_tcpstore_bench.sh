#!/usr/bin/env bash
# Builds bench/tcpstore_bench.cc against the torch that `python3` imports (its headers and
# libtorch_cpu/libc10, with the C++ ABI torch was built with), for B5's baseline on the GPU
# machine (pip torch there ships headers; Debian's python3-torch here lacks c10d's).
#
#   bench/build_tcpstore_bench.sh OUT_BINARY
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: $0 OUT_BINARY}
torch_dir=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')
abi=$(python3 -c 'import torch; print(int(torch.compiled_with_cxx11_abi()))')
g++ -O2 -std=c++17 -D_GLIBCXX_USE_CXX11_ABI="$abi" -I. \
  -I"$torch_dir/include" -I"$torch_dir/include/torch/csrc/api/include" \
  bench/tcpstore_bench.cc -o "$out" \
  -L"$torch_dir/lib" -Wl,-rpath,"$torch_dir/lib" -ltorch_cpu -lc10 -lpthread
