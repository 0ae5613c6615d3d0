#!/usr/bin/env bash
# Hosts of a Ray cluster on one machine: N network namespaces joined by veth links through a
# bridge, optional delay/loss (netem; where the kernel has no netem, TUN links through a
# userspace delay line, delayline.py), a Ray head in the first and `ray start --address`
# workers in the others (token auth, one token); CMD runs in the head's namespace, stdin
# closed; everything is torn down when CMD ends, fails or is interrupted (trap on
# EXIT/INT/TERM). Run as root.
#
#   bench/cluster/hosts.sh [--hosts N] [--delay MS] [--loss PCT] [--cpus C] [--late S]
#                          [--name PREFIX] [--no-ray] -- CMD [ARGS...]
#   bench/cluster/hosts.sh --down [--name PREFIX]     # remove what a killed run left
#
# Host i (0-based) is namespace PREFIXh<i> at 198.18.0.<i+1>/15 (RFC 2544's benchmarking range:
# addresses that route nowhere outside). MS is the one-way delay between any two hosts, PCT
# the loss of each packet. CMD sees WS_RAY_ADDRESS, WS_HOSTS ("h0=198.18.0.1 h1=..."),
# WS_NETNS_PREFIX, WS_STATE_DIR and the Ray token variables. --late S starts the workers S
# seconds after CMD (a host that joins late). Exit status: CMD's (2: bad usage, 3: set-up).
set -euo pipefail

HOSTS=2 DELAY=0 LOSS=0 CPUS=4 LATE=0 PREFIX=wsc- RAY=1 DOWN=0
usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --hosts) HOSTS=$2; shift 2 ;;
    --delay) DELAY=$2; shift 2 ;;
    --loss) LOSS=$2; shift 2 ;;
    --cpus) CPUS=$2; shift 2 ;;
    --late) LATE=$2; shift 2 ;;
    --name) PREFIX=$2; shift 2 ;;
    --no-ray) RAY=0; shift ;;
    --down) DOWN=1; shift ;;
    --) shift; break ;;
    -h|--help) usage ;;
    *) echo "hosts.sh: unknown argument $1" >&2; usage ;;
  esac
done
[[ $PREFIX =~ ^[a-z][a-z0-9-]{0,5}$ ]] || { echo "hosts.sh: --name must be 1-6 of [a-z0-9-]" >&2; exit 2; }
[[ $HOSTS =~ ^[0-9]+$ && $HOSTS -ge 1 && $HOSTS -le 32 ]] || { echo "hosts.sh: --hosts 1..32" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "hosts.sh: needs root (network namespaces)" >&2; exit 3; }

RAY_BIN=${RAY_BIN:-$(command -v ray || true)}
SW=${PREFIX}sw

# Every process in namespace $1: TERM, up to 5 s, then KILL. `ip netns pids` reads
# /proc/*/ns/net, so only processes started inside that namespace are touched (never another
# user's Ray on this machine, which `ray stop` would kill).
kill_ns() {
  local ns=$1 pids i
  for i in $(seq 50); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [[ -z $pids ]] && return 0
    if [[ $i -eq 1 ]]; then kill -TERM $pids 2>/dev/null || true; fi
    if [[ $i -eq 25 ]]; then kill -KILL $pids 2>/dev/null || true; fi
    sleep 0.2
  done
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  [[ -z $pids ]] || kill -KILL $pids 2>/dev/null || true
}

teardown() {
  local status=$? ns
  trap - EXIT INT TERM
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${PREFIX}\(h[0-9]*\|sw\)$" || true); do
    kill_ns "$ns"
    ip netns del "$ns" 2>/dev/null || true  # its veth ends (and their peers) go with it
  done
  [[ -n ${STATE:-} && -d ${STATE:-} ]] && rm -rf "$STATE"
  exit "$status"
}

if [[ $DOWN -eq 1 ]]; then  # a killed run's state folders too (named after the prefix)
  rm -rf /tmp/wsc."$PREFIX"*
  STATE=; teardown
fi
[[ $# -gt 0 ]] || { echo "hosts.sh: no command after --" >&2; exit 2; }
if ip netns list | grep -q "^${PREFIX}\(h[0-9]*\|sw\)\b"; then
  echo "hosts.sh: namespaces ${PREFIX}* exist (another run, or a killed one: --down --name $PREFIX)" >&2
  exit 3
fi
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
STATE=$(mktemp -d "/tmp/wsc.${PREFIX}XXXXXX")  # short: Ray's socket paths fit 107 bytes

ip netns add "$SW"
ip -n "$SW" link set lo up
LINK=bridge
if [[ $DELAY != 0 || $LOSS != 0 ]]; then
  # netem where the kernel has it; else TUN links and a userspace delay line (delayline.py)
  if ip netns exec "$SW" tc qdisc add dev lo root netem delay 1ms 2>/dev/null; then
    ip netns exec "$SW" tc qdisc del dev lo root
    LINK=netem
  else
    LINK=delayline
  fi
else
  ip -n "$SW" link add br0 type bridge
  ip -n "$SW" link set br0 up
fi
[[ $LINK == netem ]] && { ip -n "$SW" link add br0 type bridge; ip -n "$SW" link set br0 up; }
HOSTLIST=
for ((i = 0; i < HOSTS; i++)); do
  ns=${PREFIX}h$i addr=198.18.0.$((i + 1))
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1
  if [[ $LINK == delayline ]]; then
    ip -n "$ns" tuntap add dev eth0 mode tun
    ip -n "$ns" link set eth0 mtu 65000  # fewer packets through the delay line
  else
    ip link add "${PREFIX}e$i" netns "$ns" type veth peer name "${PREFIX}p$i" netns "$SW"
    ip -n "$ns" link set "${PREFIX}e$i" name eth0
    ip -n "$SW" link set "${PREFIX}p$i" master br0 up
  fi
  ip -n "$ns" addr add "$addr/15" dev eth0
  ip -n "$ns" link set eth0 up
  # a default route through eth0: Ray (and aioice) find "this host's address" by routing
  # toward a public address; without a route they would fall back to loopback
  ip -n "$ns" route add default dev eth0
  if [[ $LINK == netem ]]; then
    ip netns exec "$ns" tc qdisc add dev eth0 root netem delay "${DELAY}ms" loss "${LOSS}%"
  fi
  HOSTLIST+="${HOSTLIST:+ }h$i=$addr"
done
if [[ $LINK == delayline ]]; then
  ip netns exec "$SW" "${PYTHON:-python3}" "$(dirname "$0")/delayline.py" --delay "$DELAY" \
    --loss "$LOSS" $(for h in $HOSTLIST; do echo "${PREFIX}${h}"; done) > /dev/null &
  for _ in $(seq 50); do  # attached: the last host's device has its carrier
    ip -n "${PREFIX}h$((HOSTS - 1))" link show eth0 | grep -q NO-CARRIER || break
    sleep 0.1
  done
fi

HEAD=198.18.0.1:6379
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$STATE/token RAY_worker_niceness=0
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$RAY_AUTH_TOKEN_PATH"
chmod 600 "$RAY_AUTH_TOKEN_PATH"
export WS_RAY_ADDRESS=$HEAD WS_HOSTS=$HOSTLIST WS_NETNS_PREFIX=$PREFIX WS_STATE_DIR=$STATE

start_node() {  # host index; the head when 0
  local i=$1 ns=${PREFIX}h$1 addr=198.18.0.$(($1 + 1))
  local common=(--node-ip-address "$addr" --temp-dir "$STATE/h$i" --num-cpus "$CPUS"
                --resources "{\"ws_host_$i\": 1000}" --disable-usage-stats)
  if [[ $i -eq 0 ]]; then
    ip netns exec "$ns" "$RAY_BIN" start --head --port 6379 --include-dashboard=false \
      "${common[@]}" > "$STATE/h$i.log" 2>&1
  else
    ip netns exec "$ns" "$RAY_BIN" start --address "$HEAD" "${common[@]}" \
      > "$STATE/h$i.log" 2>&1
  fi
}

if [[ $RAY -eq 1 ]]; then
  [[ -x $RAY_BIN ]] || { echo "hosts.sh: no ray CLI (set RAY_BIN)" >&2; exit 3; }
  start_node 0 || { cat "$STATE/h0.log" >&2; exit 3; }
  if [[ $LATE == 0 ]]; then
    for ((i = 1; i < HOSTS; i++)); do start_node "$i" || { cat "$STATE/h$i.log" >&2; exit 3; }; done
  else
    # started from inside each late host's namespace, so the teardown finds (and ends) them
    # even while they still sleep
    for ((i = 1; i < HOSTS; i++)); do
      ip netns exec "${PREFIX}h$i" bash -c "sleep $LATE; $(declare -f start_node); \
        PREFIX=$PREFIX STATE=$STATE CPUS=$CPUS RAY_BIN=$RAY_BIN HEAD=$HEAD start_node $i" &
    done
  fi
fi
echo "hosts.sh: ${HOSTS} hosts up ($HOSTLIST; $LINK, ${DELAY} ms, ${LOSS}% loss)" >&2
# in the background and waited for: bash runs a trap only between commands, so a signal
# would otherwise wait for CMD to end by itself
set +e
ip netns exec "${PREFIX}h0" "$@" &
wait $!
