#!/usr/bin/env bash
# The README's first command: set up this machine, build tpd and tpctl, and run the daemon
# in the foreground with the embedded store. Ctrl-C stops it (SIGINT: graceful shutdown).
set -euo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh
bazel build //daemon:tpd //client:tpctl

socket="${TPD_SOCKET:-}"
if [[ -z "$socket" ]]; then
  # The daemon's own default (proto/socket_path.h): the system socket for root, else
  # $XDG_RUNTIME_DIR/tpd/tpd.sock, or /tmp/tpd-<uid>/tpd.sock without XDG_RUNTIME_DIR.
  if [[ $(id -u) -eq 0 ]]; then
    socket=/run/tpd/tpd.sock
  elif [[ -n "${XDG_RUNTIME_DIR:-}" ]]; then
    socket="$XDG_RUNTIME_DIR/tpd/tpd.sock"
  else
    socket="/tmp/tpd-$(id -u)/tpd.sock"
  fi
fi
cat <<MSG

tpd is starting on $socket. In another shell:
  bazel-bin/client/tpctl --socket $socket status
  bazel-bin/client/tpctl --socket $socket store set hello world
  bazel-bin/client/tpctl --socket $socket store get hello
  grpcurl -plaintext -unix $socket list          # where grpcurl is installed
  grpcurl -plaintext -unix $socket tpd.v1.Admin/Status

MSG
exec bazel-bin/daemon/tpd --socket "$socket" --config deploy/tpd.toml "$@"
