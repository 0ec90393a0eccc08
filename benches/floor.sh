#!/usr/bin/env bash
# The floor: how far any proxy can get ahead of nginx on this machine. The router (one worker, and one per
# core) and nginx (configured as in benches/proxy.sh) beside agent-sandbox-floor-relay, a relay that does
# nothing a relay can do without (no name, no parsing, no policy, no resolver, no log: one fixed upstream,
# bytes as they come; benches/floor-relay), run as one process and as one process per core (nginx's shape:
# SO_REUSEPORT queues, no shared state). The same upstream, load generator and rounds as benches/proxy.sh:
# new HTTPS connections (wrk -t2 -c32 and -t1 -c4), new HTTP connections (-t2 -c32), kept-alive HTTPS
# requests (-t2 -c64). What the floor cannot beat nginx by, no proxy that reads a name and decides can.
#
# Bulk is not here: the floor copies through user space, and the router's splice(2) moves less, so the
# floor is not a floor for bulk (benches/proxy.sh has socat and direct for that).
#
# Every sample is printed, so the report can be checked and re-analysed without the run.
#
# Root only (network namespace). Traffic stays on this machine: loopback, and a namespace with no default
# route. Usage: benches/floor.sh [SECONDS] [OUT.md]; ROUNDS (default 5) rounds, contenders rotated.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benches/lib.sh
. benches/lib.sh
secs=${1:-5}
out=${2:-/dev/stdout}
rounds=${ROUNDS:-5}
router=${ROUTER_BIN:-target/release/agent-sandbox-router}
floor=${FLOOR_BIN:-target/release/agent-sandbox-floor-relay}
# The default binaries are built from this checkout (a no-op when they are fresh), never reused stale.
[ -n "${ROUTER_BIN:-}" ] || cargo build --release --locked -p agent-sandbox-router
[ -n "${FLOOR_BIN:-}" ] || cargo build --release --locked -p agent-sandbox-floor-relay
[ "$(id -u)" = 0 ] || { echo "benches/floor.sh needs root (network namespace)" >&2; exit 1; }
# SO_REUSEPORT would let a relay left from an aborted run share the floor's addresses unseen.
refuse_if_listening 127.0.6.
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for tool in nginx dnsmasq wrk curl openssl unshare; do
    command -v "$tool" >/dev/null || { echo "missing $tool (make bench installs the tools)" >&2; exit 1; }
done

ns="asb-floor-$$"
veth="asbf$$"
work=$(mktemp -d)
chmod 755 "$work"
pids=()
trap bench_cleanup EXIT
ulimit -n 20000

# The upstream, as in benches/proxy.sh (RSA 2048, the same nginx), at one address per contender so one
# contender's TIME_WAIT sockets toward it never exhaust the ports of the next.
upstream_netns "$ns" "$veth" 198.18.6.1/30 198.18.6.2/30 198.18.6.5/32 198.18.6.6/32 198.18.6.7/32 \
    198.18.6.8/32 198.18.6.9/32
for a in 5 6 7 8 9; do ip route add "198.18.6.$a/32" dev "$veth"; done
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=upstream.test \
    -addext subjectAltName=DNS:upstream.test -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
mkdir -p "$work/www"
echo "hello from upstream" >"$work/www/small"
upstream_nginx "$ns" "$work"

# Names: the routers resolve upstream.test to .5 and .6, nginx to .7.
for a in 5 6 7; do
    dnsmasq --no-daemon --conf-file=/dev/null --no-resolv --no-hosts --bind-interfaces \
        --listen-address="127.0.6.$a" --port=5353 --user="$(id -un)" --pid-file= --local-ttl=300 \
        --address="/upstream.test/198.18.6.$a" --address=/#/ 2>"$work/resolver$a.log" &
    pids+=($!)
done

printf 'upstream.test\n' >"$work/allowed-hosts"
declare -A proc
# As in benches/proxy.sh, each in a session of its own (setsid), as nginx's daemonized workers are.
router_at() { # who ip resolver [router args...]
    local who=$1 ip=$2 resolver=$3
    shift 3
    setsid "$router" --allowlist "$work/allowed-hosts" --log-format json --answer "$ip" --dns "$ip:5301" --http "$ip:80" \
        --https "$ip:443" --resolver "$resolver:5353" --max-connections 20000 "$@" \
        >/dev/null 2>"$work/router-$ip.log" &
    pids+=($!)
    proc[$who]=$!
}
router_at router 127.0.6.11 127.0.6.5 --threads 1
router_at router_mt 127.0.6.12 127.0.6.6
proxy_nginx_conf "$work" 127.0.6.13 127.0.6.7:5353
nginx -c "$work/nginx-px.conf" -e "$work/nginx-px.err"
floor_at() { # who ip upstream_ip processes
    local i
    for i in $(seq "$4"); do
        setsid "$floor" --pair "$2:443=$3:443" --pair "$2:80=$3:80" >/dev/null 2>>"$work/floor-$2.log" &
        pids+=($!)
        proc[$1]+="$! "
    done
}
floor_at floor 127.0.6.14 198.18.6.8 1
floor_at floor_mt 127.0.6.15 198.18.6.9 "$(nproc)"
declare -A target=([router]=127.0.6.11 [router_mt]=127.0.6.12 [nginx]=127.0.6.13 [floor]=127.0.6.14
    [floor_mt]=127.0.6.15)
order=(router router_mt nginx floor floor_mt)

ready() { curl -sk --max-time 2 --resolve "upstream.test:443:$1" https://upstream.test/small >/dev/null; }
for who in "${order[@]}"; do
    for _ in $(seq 100); do ready "${target[$who]}" && break; sleep 0.1; done
    ready "${target[$who]}" || { echo "$who not ready (logs in $work):"; cat "$work"/*.log "$work"/*.err; exit 1; } >&2
done
nginx_pids() { pgrep -f "nginx.*$work/nginx-px.conf"; pgrep -P "$(cat "$work/nginx-px.pid")"; }
# shellcheck disable=SC2086 # one pid per word
proc_pids() { if [ "$1" = nginx ]; then nginx_pids | sort -u; else printf '%s\n' ${proc[$1]}; fi; }

declare -A samples
add() { samples[$1]+="$2 "; }
: >"$work/wrk.all"
# run WHO KEY SCHEME [WRK ARGS...]: one wrk run; records the rate and the proxy's CPU per request in µs.
run() {
    local who=$1 key=$2 scheme=$3 c0 c1 rate
    shift 3
    local -a p
    mapfile -t p < <(proc_pids "$who")
    c0=$(cpu_ticks "${p[@]}")
    rate=$(wrk_at "${target[$who]}" "$scheme://upstream.test/small" "$@" -d"${secs}s" | rps)
    c1=$(cpu_ticks "${p[@]}")
    no_rate "$rate" "$who" "$key"
    add "$who,$key" "$rate"
    add "$who,${key}_cpu" "$(awk -v t="$((c1 - c0))" -v hz="$(getconf CLK_TCK)" -v r="$rate" -v s="$secs" \
        'BEGIN { if (r > 0) printf "%.0f", t / hz * 1e6 / (r * s) }')"
}
close=(-H 'Connection: close')
for round in $(seq "$rounds"); do
    for k in "${!order[@]}"; do
        # Rotated each round: over 5 rounds each contender runs once in each of the 5 places.
        who=${order[$(((round - 1 + k) % ${#order[@]}))]}
        run "$who" https_new https -t2 -c32 "${close[@]}"
        run "$who" https_new4 https -t1 -c4 "${close[@]}"
        run "$who" http_new http -t2 -c32 "${close[@]}"
        run "$who" https_keepalive https -t2 -c64
    done
done

measures=(https_new https_new4 http_new https_keepalive https_new_cpu https_new4_cpu http_new_cpu
    https_keepalive_cpu)
declare -A result spread
summarise
{
    echo "Machine: $(machine_desc);"
    echo "router $(git describe --always --dirty 2>/dev/null || echo unknown) ($(sha256sum "$router" | cut -c1-12)), floor relay $(sha256sum "$floor" | cut -c1-12);"
    echo "load average before the run: $load_before."
    echo "$rounds rounds of $secs s, contenders rotated; medians (lowest–highest sample). The ratios to nginx are"
    echo "paired: the median of the per-round ratios (lowest–highest)."
    echo
    echo "| measure | router \`--threads 1\` | router (one worker per core) | nginx | floor, one process | floor, one process per core | router/nginx | router per core/nginx | floor/nginx | floor per core/nginx |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for m in "${measures[@]}"; do
        case $m in
            https_new) label="new HTTPS connections/s (wrk -t2 -c32)" ;;
            https_new4) label="new HTTPS connections/s, four at a time (wrk -t1 -c4)" ;;
            http_new) label="new HTTP connections/s (wrk -t2 -c32)" ;;
            https_keepalive) label="HTTPS requests/s, kept-alive (wrk -t2 -c64)" ;;
            https_new_cpu) label="proxy CPU per new HTTPS connection (-c32), µs" ;;
            https_new4_cpu) label="proxy CPU per new HTTPS connection (-c4), µs" ;;
            http_new_cpu) label="proxy CPU per new HTTP connection (-c32), µs" ;;
            https_keepalive_cpu) label="proxy CPU per kept-alive HTTPS request, µs" ;;
        esac
        echo "| $label | $(cell "router,$m") | $(cell "router_mt,$m") | $(cell "nginx,$m") | $(cell "floor,$m") | $(cell "floor_mt,$m") | $(paired router nginx "$m") | $(paired router_mt nginx "$m") | $(paired floor nginx "$m") | $(paired floor_mt nginx "$m") |"
    done
    echo
    echo "wrk's own error counts over every run (answers other than 2xx/3xx; socket errors):" \
        "$(wrk_errors "$work/wrk.all")."
    echo
    echo "Samples (router / router per core / nginx / floor / floor per core):"
    echo
    for m in "${measures[@]}"; do
        echo "- $m: ${samples[router,$m]% } / ${samples[router_mt,$m]% } / ${samples[nginx,$m]% } / ${samples[floor,$m]% } / ${samples[floor_mt,$m]% }"
    done
} >"$out"
[ "$out" = /dev/stdout ] || cat "$out"
