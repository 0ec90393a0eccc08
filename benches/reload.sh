#!/usr/bin/env bash
# Reload under load: one router answers DNS at a fixed rate (dnsperf -Q) and takes new TLS connections at a
# fixed rate (benches/paced_tls.py, open loop) while a loop rewrites its allowlist and sends SIGHUP every
# second. Fails (exit 1) unless no query was lost, every connection to the always-allowed name succeeded and
# no reload failed.
#
# The upstream is an nginx in a network namespace this script creates (198.18.0.2, no default route in it)
# over a veth pair; upstream.test resolves to it through a dnsmasq on loopback. The router listens on
# 127.0.1.1. Root only. Traffic stays on this machine.
# Usage: benches/reload.sh [SECONDS] [OUT.md]   (QPS=10000 CPS=100 to change the rates)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benches/lib.sh
. benches/lib.sh
secs=${1:-30}
out=${2:-/dev/stdout}
qps=${QPS:-10000}
cps=${CPS:-100}
router=${ROUTER_BIN:-target/release/agent-sandbox-router}
[ -x "$router" ] || cargo build --release --locked -p agent-sandbox-router
[ "$(id -u)" = 0 ] || { echo "benches/reload.sh needs root (network namespace)" >&2; exit 1; }
for tool in nginx dnsmasq dnsperf curl openssl python3; do
    command -v "$tool" >/dev/null || { echo "missing $tool (make bench installs the tools)" >&2; exit 1; }
done

ns="asb-reload-$$"
veth="asbr$$"
work=$(mktemp -d)
chmod 755 "$work"
pids=()
trap bench_cleanup EXIT

# --- the upstream host ---------------------------------------------------------------------------
upstream_netns "$ns" "$veth" 198.18.0.1/30 198.18.0.2/30
upstream_cert "$work"
mkdir -p "$work/www"
echo "hello from upstream" >"$work/www/small"
upstream_nginx "$ns" "$work"

dnsmasq --no-daemon --conf-file=/dev/null --no-resolv --no-hosts --bind-interfaces \
    --listen-address=127.0.3.1 --port=5353 --user="$(id -un)" --pid-file= \
    --local-ttl=300 --address=/upstream.test/198.18.0.2 --address=/#/ 2>"$work/resolver.log" &
pids+=($!)

# --- the router ----------------------------------------------------------------------------------
# The allowlist always holds upstream.test and .stable.test; each rewrite adds a fresh name and drops the
# previous one, so every reload changes the policy.
write_allowlist() { # generation
    printf 'upstream.test\n.stable.test\ngen-%s.test\n' "$1" >"$work/allowed-hosts.new"
    mv "$work/allowed-hosts.new" "$work/allowed-hosts"
}
write_allowlist 0
admin=127.0.1.1:9901
"$router" --allowlist "$work/allowed-hosts" --log-format json --answer 127.0.1.1 --dns 127.0.1.1:5301 \
    --http 127.0.1.1:18080 --https 127.0.1.1:443 --resolver 127.0.3.1:5353 --admin "$admin" \
    ${ROUTER_THREADS:+--threads "$ROUTER_THREADS"} 2>"$work/router.log" &
pids+=($!)
router_pid=$!

ready() { curl -sk --max-time 2 --resolve "upstream.test:443:$1" https://upstream.test/small >/dev/null; }
for _ in $(seq 100); do
    ready 127.0.1.1 && curl -sf --max-time 1 "http://$admin/readyz" >/dev/null && break
    sleep 0.1
done
ready 127.0.1.1 || { echo "router not ready:"; cat "$work/router.log"; exit 1; } >&2

ok_before=$(router_reloads "$admin" success)
failed_before=$(router_reloads "$admin" failure)

dns_queries "$work/queries"

# dnsperf's own timeout (-t 5 s) decides "lost"; the limit of -l ends its sending, then it waits for the
# answers still outstanding.
dnsperf -s 127.0.1.1 -p 5301 -d "$work/queries" -l "$secs" -Q "$qps" -c 4 -q 500 -t 5 \
    >"$work/dnsperf.out" 2>&1 &
dns_pid=$!
pids+=("$dns_pid")
python3 benches/paced_tls.py --ip 127.0.1.1 --name upstream.test --rate "$cps" --seconds "$secs" \
    >"$work/tls.out" 2>"$work/tls.err" &
tls_pid=$!
pids+=("$tls_pid")

cpu_before=$(cpu_ticks "$router_pid")
sighups=0
for gen in $(seq 1 "$secs"); do
    sleep 1
    write_allowlist "$gen"
    kill -HUP "$router_pid" 2>/dev/null ||
        { echo "reload bench FAILED: the router exited during the run"; tail -n 30 "$work/router.log"; exit 1; } >&2
    sighups=$((sighups + 1))
done
dns_status=0
wait "$dns_pid" || dns_status=$?
tls_status=0
wait "$tls_pid" || tls_status=$?
cpu_after=$(cpu_ticks "$router_pid")
# Both the signal and the file watch may trigger a reload for one rewrite; let a last one settle.
sleep 2
ok=$(($(router_reloads "$admin" success) - ok_before))
failed=$(($(router_reloads "$admin" failure) - failed_before))

field() { dnsperf_field "$work/dnsperf.out" "$1"; }
sent=$(field '  Queries sent:')
completed=$(field '  Queries completed:')
lost=$(field '  Queries lost:')
rcodes=$(awk -F': *' '/Response codes:/ {print $2; exit}' "$work/dnsperf.out")
achieved=$(field '  Queries per second:')
# paced_tls.py prints one line: key=value pairs.
declare -A tls
kvs=()
read -ra kvs <"$work/tls.out" || true
for kv in "${kvs[@]}"; do tls[${kv%%=*}]=${kv#*=}; done

status=ok
problems=()
[ "$dns_status" = 0 ] && [ -n "$sent" ] || problems+=("dnsperf failed (status $dns_status)")
[ "${lost:-1}" = 0 ] || problems+=("${lost:-?} DNS queries lost")
[ "${tls[failed]:-1}" = 0 ] && [ "$tls_status" = 0 ] || problems+=("${tls[failed]:-?} TLS connections failed (${tls[reasons]:-see log})")
[ "$failed" = 0 ] || problems+=("$failed reloads failed")
[ "$ok" -ge "$sighups" ] || problems+=("only $ok successful reloads for $sighups rewrites")
[ "${#problems[@]}" = 0 ] || status="FAILED: $(IFS=';'; echo "${problems[*]}")"

{
    echo "| measure | value |"
    echo "|---|---:|"
    echo "| DNS queries sent / answered / lost (dnsperf -Q $qps) | $sent / $completed / $lost |"
    echo "| DNS queries/s achieved | ${achieved%.*} |"
    echo "| TLS connections attempted / succeeded / failed (paced, $cps/s) | ${tls[attempted]:-?} / ${tls[succeeded]:-?} / ${tls[failed]:-?} |"
    echo "| TLS connection time p50 / p99 / max, ms | ${tls[p50_ms]:-?} / ${tls[p99_ms]:-?} / ${tls[max_ms]:-?} |"
    echo "| pacing: the client's worst lateness, ms | ${tls[late_max_ms]:-?} |"
    echo "| allowlist rewrites + SIGHUP | $sighups |"
    echo "| reloads counted by /metrics: success / failure | $ok / $failed |"
    echo "| router CPU during the run, s | $(awk -v t="$((cpu_after - cpu_before))" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.2f", t / hz}') |"
    echo
    echo "DNS response codes: ${rcodes:-?}. Result: $status."
} >"$out"
[ "$out" = /dev/stdout ] || cat "$out"
if [ "$status" != ok ]; then
    {
        echo "reload bench $status"
        echo "--- dnsperf"; cat "$work/dnsperf.out"
        echo "--- paced TLS client"; cat "$work/tls.out" "$work/tls.err"
        echo "--- router log (last 30 lines)"; tail -n 30 "$work/router.log"
    } >&2
    exit 1
fi
