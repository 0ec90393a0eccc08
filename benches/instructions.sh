#!/usr/bin/env bash
# User-space instructions the router executes per kept-alive HTTPS request, per new HTTPS connection and
# per new HTTP connection, counted by callgrind (valgrind), beside the floor relay (benches/floor-relay)
# doing the same work. On this project's shared 2-core machines a change worth 5 % of the router's CPU is
# lost in the spread of any timed run (BENCHMARKS.md, issue 18); an instruction count is not: two runs of
# the same binary agree to within 3 % per new connection and 0.2 % per kept-alive request. So a change
# to the router's own code can be shown here, and its effect on time checked with benches/ab.sh, which
# can show whether it hurts but not a small gain.
#
# What it does not count: the kernel, where most of a connection's CPU goes (system calls, TCP), and
# anything that depends on load. The client is wrk with one connection (-t1 -c1), so every step of every
# connection is a wake-up of its own; under load the per-wake-up costs are shared by several connections.
# callgrind runs the router about 50 times slower, so each kind runs INSTR_SECONDS (default 6) and the
# count is divided by the requests wrk completed; the counters are zeroed before each kind and dumped after.
#
# Usage: benches/instructions.sh [ROUTER_A [ROUTER_B]]   (root: network namespace; needs valgrind, nginx,
# dnsmasq, wrk, curl, openssl). Without arguments it builds the router and the floor relay with the
# `profiling` profile (symbols, so the per-function lists name functions). Callgrind's files and each
# kind's top functions stay in INSTR_OUT (default target/instructions). Traffic stays on this machine:
# loopback, and a network namespace of this script's own with no default route.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "benches/instructions.sh needs root (network namespace)" >&2; exit 1; }
for tool in valgrind callgrind_control callgrind_annotate nginx dnsmasq wrk curl openssl unshare; do
    command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install valgrind for callgrind)" >&2; exit 1; }
done
secs=${INSTR_SECONDS:-6}
out=${INSTR_OUT:-target/instructions}
floor=target/profiling/agent-sandbox-floor-relay
if [ $# -eq 0 ]; then
    cargo build --locked --profile profiling -p agent-sandbox-router -p agent-sandbox-floor-relay
    routers=(target/profiling/agent-sandbox-router)
else
    cargo build --locked --profile profiling -p agent-sandbox-floor-relay
    routers=("$@")
fi
for b in "${routers[@]}" "$floor"; do [ -x "$b" ] || { echo "not an executable: $b" >&2; exit 1; }; done
# shellcheck source=benches/lib.sh
. benches/lib.sh
refuse_if_listening 127.0.9.

ns="asb-in-$$"
veth="asbin$$"
work=$(mktemp -d)
chmod 755 "$work"
pids=()
trap bench_cleanup EXIT
rm -rf "$out"
mkdir -p "$out"

upstream_netns "$ns" "$veth" 198.18.9.1/30 198.18.9.2/30
upstream_cert "$work"
mkdir -p "$work/www"
echo "hello from upstream" >"$work/www/small"
upstream_nginx "$ns" "$work"
dnsmasq --no-daemon --conf-file=/dev/null --no-resolv --no-hosts --bind-interfaces \
    --listen-address=127.0.9.11 --port=5353 --user="$(id -un)" --pid-file= --local-ttl=300 \
    --address=/upstream.test/198.18.9.2 --address=/#/ 2>"$work/resolver.log" &
pids+=($!)
printf 'upstream.test\n' >"$work/allowed-hosts"

kinds=(keep https http)
declare -A per=()
# measure WHO IP PID: each kind's instructions per request (kept-alive) or per connection (new).
measure() {
    local who=$1 ip=$2 pid=$3 kind url hdr dump n ir dumps=0
    echo "$ip upstream.test" >"$work/hosts"
    for kind in "${kinds[@]}"; do
        url=https://upstream.test/small
        [ "$kind" = http ] && url=http://upstream.test/small
        hdr=()
        [ "$kind" != keep ] && hdr=(-H 'Connection: close')
        callgrind_control --zero "$pid" >/dev/null 2>&1
        # shellcheck disable=SC2016 # expanded by the inner shell
        unshare --mount sh -c 'mount --bind "$1" /etc/hosts && shift && exec wrk "$@"' sh "$work/hosts" \
            -t1 -c1 -d"${secs}s" "${hdr[@]}" "$url" >"$work/wrk.out" 2>&1
        callgrind_control --dump="$who-$kind" "$pid" >/dev/null 2>&1
        # The dump just made: callgrind numbers its dumps from 1.
        dumps=$((dumps + 1))
        dump="$out/$who.callgrind.$pid.$dumps"
        n=$(awk '/requests in/ {print $1}' "$work/wrk.out")
        if ! [ "${n:-0}" -gt 0 ] 2>/dev/null || grep -q "Non-2xx\|Socket errors" "$work/wrk.out"; then
            echo "$who $kind: wrk completed no clean run:" >&2
            cat "$work/wrk.out" >&2
            exit 1
        fi
        callgrind_annotate --auto=no --threshold=100 "$dump" >"$work/annotated" 2>/dev/null
        ir=$(awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}' "$work/annotated")
        per[$who,$kind]=$((ir / n))
        # The functions' own instructions, per unit; the frames open while counting (main and the
        # runtime's loop, about all of the total) are left out.
        awk -v n="$n" -v total="$ir" '
            f && /%\)/ { x = $1; gsub(",", "", x); line = $0; sub(/^ *[0-9,]+ +\( *[0-9.]+%\) +/, "", line)
                if (x + 0 < total / 2) { printf "%8.0f %s\n", x / n, line; if (++k == 25) exit } }
            /^Ir +file:function/ { getline; f = 1 }' "$work/annotated" >"$out/$who-$kind.top.txt"
    done
}

# start WHO IP ARGS...: the binary ARGS under callgrind, serving IP; returns once it relays.
start() {
    local who=$1 ip=$2
    shift 2
    valgrind --tool=callgrind --callgrind-out-file="$out/$who.callgrind.%p" "$@" 2>"$work/$who.log" &
    pid=$!
    pids+=("$pid")
    for _ in $(seq 300); do
        curl -sk --max-time 2 --resolve "upstream.test:443:$ip" -o /dev/null https://upstream.test/small && return
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    echo "$who did not start:" >&2
    cat "$work/$who.log" >&2
    exit 1
}

whos=()
i=0
for r in "${routers[@]}"; do
    who=router$i
    whos+=("$who")
    start "$who" 127.0.9.12 "$r" --allowlist "$work/allowed-hosts" --log-format json --answer 127.0.9.12 \
        --dns 127.0.9.12:5301 --http 127.0.9.12:80 --https 127.0.9.12:443 \
        --resolver 127.0.9.11:5353 --threads 1
    measure "$who" 127.0.9.12 "$pid"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    i=$((i + 1))
done
start floor 127.0.9.14 "$floor" --pair 127.0.9.14:443=198.18.9.2:443 --pair 127.0.9.14:80=198.18.9.2:80
measure floor 127.0.9.14 "$pid"
whos+=(floor)

head="| user-space instructions (callgrind, one connection at a time)"
rule="|---"
for w in "${whos[@]}"; do head+=" | $w"; rule+="|---:"; done
echo
for i in "${!routers[@]}"; do echo "router$i: ${routers[$i]} ($(sha256sum "${routers[$i]}" | cut -c1-12))"; done
echo "floor: $floor"
echo
echo "$head |"
echo "$rule|"
for kind in "${kinds[@]}"; do
    case $kind in
        keep) label="per kept-alive HTTPS request" ;;
        https) label="per new HTTPS connection" ;;
        http) label="per new HTTP connection" ;;
    esac
    row="| $label"
    for w in "${whos[@]}"; do row+=" | ${per[$w,$kind]}"; done
    echo "$row |"
done
echo
echo "wrk -t1 -c1, ${secs} s per kind under callgrind; each kind's top functions (own instructions per unit): $out/*.top.txt"
