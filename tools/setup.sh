#!/usr/bin/env bash
# Installs everything tpd needs to build and test on a fresh Debian 12 machine, from
# Debian's archive only (no other network). Safe to run again: installed packages are skipped.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap          # Bazel 4.2.3
  g++
  protobuf-compiler libprotobuf-dev
  protobuf-compiler-grpc libgrpc++-dev grpc-proto
  libabsl-dev
  libssl-dev               # libcrypto: the HMAC of peer calls (store/remote/peer_mac)
  libspdlog-dev libfmt-dev
  libtomlplusplus-dev
  libtensorpipe-dev
  libsystemd-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3                  # tools/count_tests.py
  iproute2                 # ip netns, for tests/integration/netns_test
  openssl                  # certificates for tests/integration/peer_test's mutual TLS
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
