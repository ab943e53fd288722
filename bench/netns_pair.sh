#!/usr/bin/env bash
# Two network "nodes" on one host for relay_bench and cuda_bench --remote (issue 18, target 7):
# the root namespace holds 10.77.0.1 and namespace tpdB holds 10.77.0.2, joined by a veth
# pair, so a pipe between daemons in them is TCP over an interface, as between machines
# (TensorPipe's shm transport does not cross namespaces). Needs root and `ip` (iproute2; on
# the GPU machine, carry it: tools/device_bundle.sh --ip).
#
#   bench/netns_pair.sh up      # then: relay_bench --netns_b=/run/netns/tpdB \
#                               #         --host_a=10.77.0.1 --host_b=10.77.0.2 ...
#   bench/netns_pair.sh down
set -euo pipefail
case ${1:-up} in
  up)
    ip netns add tpdB
    ip link add tpd-va type veth peer name tpd-vb
    ip link set tpd-vb netns tpdB
    ip addr add 10.77.0.1/24 dev tpd-va
    ip link set tpd-va up
    ip -n tpdB addr add 10.77.0.2/24 dev tpd-vb
    ip -n tpdB link set tpd-vb up
    ip -n tpdB link set lo up
    echo "netns tpdB up: 10.77.0.1 (here) <-> 10.77.0.2 (tpdB), veth mtu $(cat /sys/class/net/tpd-va/mtu)"
    ;;
  down)
    ip link del tpd-va 2>/dev/null || true
    ip netns del tpdB 2>/dev/null || true
    ;;
  *)
    echo "usage: $0 up|down" >&2
    exit 2
    ;;
esac
