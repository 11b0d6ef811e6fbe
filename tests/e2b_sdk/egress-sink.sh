#!/usr/bin/env bash
# Runs a command where nothing can leave this host, and records what tried to: a network
# namespace of its own (as root: `unshare -n`) whose only route out is a veth pair with both
# ends inside it (forwarding off), so a packet for an outside address goes nowhere. nftables
# records each destination a packet was sent to (OUTDIR/sink.nft: sets tcp4, udp4, any4, any6)
# and a stand-in resolver on the addresses of /etc/resolv.conf answers every DNS question
# REFUSED and logs it (OUTDIR/dns.log). Loopback works as usual, so a serve and the suites
# run inside as outside; sandboxes' egress (slirp4netns, serve's egress proxy) leaves from
# here too and is recorded alike. Used to check that the official suites, deselections
# applied, contact no outside address:
#
#   tests/e2b_sdk/egress-sink.sh OUTDIR bash tests/e2b_sdk/official.sh --sdk 2.45.1 --js
#
# (official.sh asks PyPI for the newest `e2b` when no --sdk is given: name them here.)
# Exits with the command's status; empty sets and an empty dns.log mean nothing tried.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: egress-sink.sh OUTDIR COMMAND…" >&2; exit 2; }
out="$1"
shift
mkdir -p "$out" && : >"$out/dns.log"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec unshare -n bash -c '
out="$1" here="$2"
shift 2
set -e
sysctl -qw net.ipv4.ip_forward=0 net.ipv6.conf.all.forwarding=0
ip link set lo up
ip link add sink0 type veth peer name sink1
ip link set sink0 arp off
ip link set sink0 up
ip link set sink1 up
ip addr add 192.0.2.1/24 dev sink0
ip route add default dev sink0
ip -6 addr add 2001:db8::1/64 dev sink0 nodad
ip -6 route add default dev sink0
nft -f - <<NFT
table inet sink {
  set tcp4 { type ipv4_addr . inet_service; flags dynamic; size 65535; }
  set udp4 { type ipv4_addr . inet_service; flags dynamic; size 65535; }
  set any4 { type ipv4_addr; flags dynamic; size 65535; }
  set any6 { type ipv6_addr; flags dynamic; size 65535; }
  chain out {
    type filter hook output priority 0;
    oifname "sink0" meta nfproto ipv4 meta l4proto tcp add @tcp4 { ip daddr . tcp dport }
    oifname "sink0" meta nfproto ipv4 meta l4proto udp add @udp4 { ip daddr . udp dport }
    oifname "sink0" meta nfproto ipv4 add @any4 { ip daddr } counter
    oifname "sink0" meta nfproto ipv6 ip6 daddr != ff00::/8 add @any6 { ip6 daddr } counter
  }
}
NFT
resolvers=()
for ns in $(awk "/^nameserver/ {print \$2}" /etc/resolv.conf); do
  case "$ns" in 127.*) ;; *:*) continue ;; *) ip addr add "$ns/32" dev lo ;; esac
  python3 "$here/egress_sink_dns.py" "$ns" "$out/dns.log" "$out/.ready-$ns" &
  resolvers+=($!)
  for _ in $(seq 100); do [ -e "$out/.ready-$ns" ] && break; sleep 0.05; done
  rm -f "$out/.ready-$ns"
done
set +e
"$@"
rc=$?
nft list table inet sink >"$out/sink.nft"
[ ${#resolvers[@]} -eq 0 ] || kill "${resolvers[@]}"
exit $rc
' egress-sink "$out" "$here" "$@"
