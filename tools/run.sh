#!/usr/bin/env bash
# The README's first command: set up this machine, build, start two tpd daemons on loopback as
# two nodes (node0 and node1), run the example (examples/tensor_calls.cc) as four workers of
# one group, two per node, print what they did, and leave both daemons serving for a look with
# tpctl or grpcurl. Ctrl-C stops them (SIGTERM: graceful shutdown).
#
#   tools/run.sh [TPD FLAGS...]     e.g. tools/run.sh --log_level debug (given to both daemons)
#
# Exits 1, stopping the daemons, when a daemon does not start or a worker fails a check.
set -euo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh
bazel build //daemon:tpd //client:tpctl //examples:tensor_calls //client/c:libtpd_client.so

# Each node's socket, config and log go in a directory of its own, under the directory the
# daemon itself would choose (proto/socket_path.h): the system one for root, else
# $XDG_RUNTIME_DIR/tpd, or /tmp/tpd-<uid> without XDG_RUNTIME_DIR.
if [[ $(id -u) -eq 0 ]]; then
  base=/run/tpd
elif [[ -n "${XDG_RUNTIME_DIR:-}" ]]; then
  base="$XDG_RUNTIME_DIR/tpd"
else
  base="/tmp/tpd-$(id -u)"
fi
tpctl=bazel-bin/client/tpctl
nodes=(node0 node1)
world_size=4  # workers, spread evenly over the nodes

# Daemons and workers this script started; all are stopped when it exits, however it exits.
children=()
stop() {
  trap - INT TERM
  for pid in "${children[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait
}
trap stop EXIT
trap 'echo; echo "stopping both daemons"; exit 130' INT
trap 'exit 143' TERM

# A daemon that already serves here (an earlier run.sh still running) would answer for ours.
for node in "${nodes[@]}"; do
  if "$tpctl" --socket "$base/$node/tpd.sock" health >/dev/null 2>&1; then
    echo "a tpd already serves on $base/$node/tpd.sock (another tools/run.sh?); stop it first"
    exit 1
  fi
done

# The nodes' daemons share one cluster token, new for every run; it never leaves the configs.
token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
for node in "${nodes[@]}"; do
  dir="$base/$node"
  mkdir -p -m 0700 "$dir"
  # Readable by this user only: it holds the token. Options not set keep the defaults that
  # deploy/tpd.toml documents.
  (umask 077 && cat >"$dir/tpd.toml" <<TOML
# Written by tools/run.sh for one run.
[daemon]
socket = "$dir/tpd.sock"
[peer]
listen_address = "127.0.0.1:0"  # port 0: a free port, shown by tpctl --json status
token = "$token"
node_name = "$node"
[data]
arena_bytes = 268435456  # 256 MiB per heap: the example's 16 MiB calls, and bigger ones of yours
TOML
  )
  bazel-bin/daemon/tpd --config "$dir/tpd.toml" "$@" >"$dir/tpd.log" 2>&1 &
  children+=($!)
done

for i in "${!nodes[@]}"; do
  socket="$base/${nodes[i]}/tpd.sock"
  for ((tries = 0; ; ++tries)); do
    if ! kill -0 "${children[i]}" 2>/dev/null || ((tries == 100)); then
      echo "tpd ${nodes[i]} did not start; the end of $base/${nodes[i]}/tpd.log:"
      tail -n 20 "$base/${nodes[i]}/tpd.log"
      exit 1
    fi
    "$tpctl" --socket "$socket" health >/dev/null 2>&1 && break
    sleep 0.1
  done
done
# The group meets in node0's store, through its peer port.
peer0=$("$tpctl" --socket "$base/node0/tpd.sock" --json status |
        sed -n 's/^ *"peer_address": "\(.*\)",*$/\1/p')
[[ -n "$peer0" ]] || { echo "tpd node0 reports no peer address; see $base/node0/tpd.log"; exit 1; }
echo
echo "tpd node0 and node1 serve on $base/node0/tpd.sock and $base/node1/tpd.sock;"
echo "$world_size workers join group \"example\" through tcp://$peer0 (node0's peer port):"
echo

workers=()
for ((rank = 0; rank < world_size; ++rank)); do
  node=${nodes[rank * ${#nodes[@]} / world_size]}
  bazel-bin/examples/tensor_calls --socket "$base/$node/tpd.sock" --init_method "tcp://$peer0" \
    --rank "$rank" --world_size "$world_size" >"$base/worker$rank.log" 2>&1 &
  workers+=($!)
  children+=($!)
done
failed=0
for ((rank = 0; rank < world_size; ++rank)); do
  wait "${workers[rank]}" || failed=$((failed + 1))
  cat "$base/worker$rank.log"
done
echo
if ((failed)); then
  echo "example: $failed of $world_size workers FAILED (their lines above say why);" \
       "daemon logs: $base/node0/tpd.log, $base/node1/tpd.log"
  exit 1
fi
echo "example: all $world_size workers passed every check, calling across two daemons"

# The same across the two daemons from Python: examples/python/parameter_server.py, a program
# written for torch.distributed.rpc with its import changed to tpd.rpc, its ranks spread over
# the nodes and meeting through env:// (MASTER_ADDR, MASTER_PORT) as any torch job does.
echo
echo "python: a parameter server and $((world_size - 1)) trainers (tpd.rpc), across both daemons:"
master_port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
workers=()
for ((rank = 0; rank < world_size; ++rank)); do
  node=${nodes[rank * ${#nodes[@]} / world_size]}
  TPD_SOCKET="$base/$node/tpd.sock" TPD_CLIENT_LIBRARY=bazel-bin/client/c/libtpd_client.so \
    PYTHONPATH=python MASTER_ADDR=127.0.0.1 MASTER_PORT=$master_port TPD_RPC_HOME="tcp://$peer0" \
    /usr/bin/python3 examples/python/parameter_server.py --rank "$rank" \
    --world_size "$world_size" >"$base/python$rank.log" 2>&1 &
  workers+=($!)
  children+=($!)
done
failed=0
for ((rank = 0; rank < world_size; ++rank)); do
  wait "${workers[rank]}" || { failed=$((failed + 1)); cat "$base/python$rank.log"; }
done
cat "$base/python0.log"
if ((failed)); then
  echo "python example: $failed of $world_size ranks FAILED (their logs above say why)"
  exit 1
fi
echo "python example: passed (examples/python/rl_observer_agent.py is the other one)"

cat <<MSG

Both daemons keep serving until Ctrl-C. In another shell:
  $tpctl --socket $base/node0/tpd.sock status
  $tpctl --socket $base/node1/tpd.sock group show example --init_method tcp://$peer0
  grpcurl -plaintext -unix $base/node0/tpd.sock tpd.v1.Admin/Status   # where grpcurl is installed
Logs: $base/node0/tpd.log, $base/node1/tpd.log

MSG
# Returns when a daemon exits on its own (then the EXIT trap stops the other) or on Ctrl-C.
wait -n "${children[@]:0:${#nodes[@]}}" || true
echo "a daemon exited; the end of its log is in $base/node0/tpd.log or $base/node1/tpd.log"
exit 1
