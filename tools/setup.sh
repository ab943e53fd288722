#!/usr/bin/env bash
# Installs everything tpd needs to build and test on a fresh Debian 12 machine, from
# Debian's archive only (no other network). Safe to run again: installed packages are skipped.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap          # Bazel 4.2.3
  g++
  clang                    # the compiler (.bazelrc): its thread-safety analysis checks locks
  protobuf-compiler libprotobuf-dev
  protobuf-compiler-grpc libgrpc++-dev grpc-proto
  libabsl-dev
  libssl-dev               # libcrypto: HMAC-SHA256 (base/hmac) and the SHA-256 of peer calls
  libspdlog-dev libfmt-dev
  libtomlplusplus-dev
  libtensorpipe-dev
  libsystemd-dev
  prometheus-cpp-dev       # prometheus-cpp 1.0.1: the daemon's /metrics (daemon/metrics)
  libgtest-dev libgmock-dev libbenchmark-dev
  python3                  # tools/count_tests.py
  iproute2                 # ip netns, for tests/integration/netns_test
  openssl                  # certificates for tests/integration/peer_test's mutual TLS
  etcd-server              # etcd 3.4: the real cluster tests/store/etcd starts on loopback
  python3-torch            # PyTorch 1.13 (CPU): tpd.rpc runs beside torch.distributed.rpc
  libtorch-dev python3-pybind11 python3-dev  # torch's C++ headers: tpd._C, the TPD backend
  python3-torchvision      # ResNet blocks of PyTorch's RPC examples (tests/python/pytorch_examples)
  python3-pytest           # tests/python
  python3-pip python3-wheel  # tests/python checks `pip install ./python` works offline
  binutils                 # nm: tests/python checks what libtpd_client.so exports
  git clang-format python3-flake8  # tools/lint.sh: the style .clang-format and .flake8 declare
  clang-tidy               # tools/tidy.sh: the checks .clang-tidy declares
  dpkg-dev lintian man-db  # tools/package.sh's .deb (dpkg-shlibdeps) and its checks
)

# etcd's v3 API (.proto files) for store/etcd, from Debian's Go source packages. Installing
# them pulls in ~130 Go packages, so only these three are unpacked (2 MB of .debs) under
# ETCD_API_DIR; bazel/etcd_api.bzl finds them there (or under /usr/share/gocode/src when
# the packages are installed).
ETCD_API_DIR=/usr/local/share/tpd/etcd-api
ETCD_API_PACKAGES=(
  golang-etcd-server-dev                         # etcdserverpb/rpc.proto, mvccpb, authpb
  golang-github-gogo-protobuf-dev                # gogoproto/gogo.proto, which they import
  golang-github-grpc-ecosystem-grpc-gateway-dev  # google/api/annotations.proto, http.proto
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "tpd setup: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Unpacks Debian packages into a folder without installing them: unpack_debs DIR PACKAGE...
unpack_debs() {
  local dir=$1
  shift
  [[ -f "$dir/.complete" ]] && return 0
  echo "tpd setup: unpacking $* into $dir"
  local sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  local download_dir
  download_dir=$(mktemp -d)
  if ! (cd "$download_dir" && apt-get download -q "$@"); then
    $sudo apt-get update -q
    (cd "$download_dir" && apt-get download -q "$@")
  fi
  $sudo mkdir -p "$dir"
  for deb in "$download_dir"/*.deb; do $sudo dpkg -x "$deb" "$dir"; done
  $sudo touch "$dir/.complete"
  rm -rf "$download_dir"
}

unpack_debs "$ETCD_API_DIR" "${ETCD_API_PACKAGES[@]}"

# Prometheus 2.42 (promtool and the server) for tests/integration:metrics_test, unpacked and
# not installed: the package would enable a Prometheus service on port 9090 of this machine.
# The tests find them under PROMETHEUS_DIR/usr/bin.
PROMETHEUS_DIR=/usr/local/share/tpd/prometheus
unpack_debs "$PROMETHEUS_DIR" prometheus
