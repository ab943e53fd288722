#!/usr/bin/env bash
# Builds tpd's Debian package, offline: tpd_<version>_<arch>.deb in DIR (default dist/).
#
#   tools/package.sh [DIR]
#   sudo apt install ./dist/tpd_0.1.0_amd64.deb      # then: systemctl status tpd
#
# The binaries are built with -c opt; deploy/make_deb.sh says what goes where.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-dist}"
bazel build -c opt //daemon:tpd //client:tpctl //client/c:libtpd_client.so
bin="$(bazel info -c opt bazel-bin)"
deploy/make_deb.sh --tpd "$bin/daemon/tpd" --tpctl "$bin/client/tpctl" \
  --lib "$bin/client/c/libtpd_client.so" --out "$out"
