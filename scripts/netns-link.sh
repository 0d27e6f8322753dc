#!/usr/bin/env bash
# Two network namespaces joined by a veth pair whose both ends the kernel shapes (tc htb: a
# token bucket at RATE), so that every byte between them, gradwire's or gloo's, pays the link.
#
#   scripts/netns-link.sh up [RATE]           # default 1gbit: gwns0 10.77.0.1, gwns1 10.77.0.2
#   scripts/netns-link.sh down
#   ip netns exec gwns0 CMD                   # a rank on one side
# Needs root (CAP_NET_ADMIN) and iproute2.
set -euo pipefail
cmd="${1:-}"
RATE="${2:-1gbit}"
down() {
  ip netns del gwns0 2>/dev/null || true
  ip netns del gwns1 2>/dev/null || true
}
case "$cmd" in
  up)
    down
    ip netns add gwns0
    ip netns add gwns1
    ip link add gwveth0 type veth peer name gwveth1
    ip link set gwveth0 netns gwns0
    ip link set gwveth1 netns gwns1
    ip -n gwns0 addr add 10.77.0.1/24 dev gwveth0
    ip -n gwns1 addr add 10.77.0.2/24 dev gwveth1
    for i in 0 1; do
      ip -n "gwns$i" link set lo up
      ip -n "gwns$i" link set "gwveth$i" up
      # htb rather than netem: this kernel may lack sch_netem; htb shapes the rate alone.
      tc -n "gwns$i" qdisc add dev "gwveth$i" root handle 1: htb default 10 r2q 1000
      tc -n "gwns$i" class add dev "gwveth$i" parent 1: classid 1:10 htb rate "$RATE" ceil "$RATE"
    done
    echo "gwns0 (10.77.0.1) <-> gwns1 (10.77.0.2): $RATE each way"
    ;;
  down) down ;;
  *) echo "usage: $0 up [RATE] | down" >&2; exit 2 ;;
esac
