#!/usr/bin/env bash
# DNS benchmark: agent-sandbox-router vs dnsmasq answering the same allowlist, same machine, same run.
# Loopback only. Usage: benches/dns.sh [SECONDS]   (needs dnsperf and dnsmasq: apt-get install dnsperf dnsmasq-base)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
router=${ROUTER_BIN:-target/release/agent-sandbox-router}
[ -x "$router" ] || cargo build --release -p agent-sandbox-router
for tool in dnsperf dnsmasq; do
    command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install dnsperf dnsmasq-base)" >&2; exit 1; }
done

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

cat >"$work/allowed-hosts" <<'LIST'
api.anthropic.com
.example.com
db.example.com:5432
LIST
# Half allowed (A answers), half refused (NXDOMAIN), like a sandbox under an exfiltration attempt.
{
    for i in $(seq 1 500); do
        echo "api.anthropic.com A"
        echo "host$i.example.com A"
        echo "host$i.evil.test A"
        echo "x$i.exfil.test A"
    done
} >"$work/queries"

"$router" --allowlist "$work/allowed-hosts" --answer 10.9.8.7 --dns 127.0.1.1:5301 \
    --http 127.0.1.1:18080 --https 127.0.1.1:18443 --forward db.example.com:5432=127.0.1.1:15432 \
    2>"$work/router.log" &
pids+=($!)
router_pid=$!
# dnsmasq: --address=/name/IP answers a name and its subdomains; /#/ with no address answers NXDOMAIN.
dnsmasq --no-daemon --conf-file=/dev/null --no-resolv --no-hosts --bind-interfaces \
    --listen-address=127.0.1.2 --port=5302 --user="$(id -un)" --pid-file= --cache-size=0 \
    --address=/api.anthropic.com/10.9.8.7 --address=/example.com/10.9.8.7 --address=/#/ \
    2>"$work/dnsmasq.log" &
pids+=($!)
dnsmasq_pid=$!
for i in $(seq 100); do
    dig +short +time=1 +tries=1 @127.0.1.1 -p 5301 api.anthropic.com >/dev/null 2>&1 &&
        dig +short +time=1 +tries=1 @127.0.1.2 -p 5302 api.anthropic.com >/dev/null 2>&1 && break
    sleep 0.1
done

rss() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
echo "idle RSS: router $(rss "$router_pid") KiB, dnsmasq $(rss "$dnsmasq_pid") KiB"

run() { # name server port
    local out
    out=$(dnsperf -s "$2" -p "$3" -d "$work/queries" -l "$secs" -c 4 -q 200 2>&1)
    local qps lost
    qps=$(awk '/Queries per second/ {print $4}' <<<"$out")
    lost=$(awk '/Queries lost/ {print $3}' <<<"$out")
    printf '| %-8s | %12s | %8s |\n' "$1" "$qps" "$lost"
    echo "$qps" >"$work/$1.qps"
}
echo "| server   |    queries/s |     lost |"
echo "|----------|--------------|----------|"
run router 127.0.1.1 5301
run dnsmasq 127.0.1.2 5302
echo "ratio router/dnsmasq: $(awk -v a="$(cat "$work/router.qps")" -v b="$(cat "$work/dnsmasq.qps")" 'BEGIN {printf "%.2f", a/b}')"
echo "RSS after: router $(rss "$router_pid") KiB, dnsmasq $(rss "$dnsmasq_pid") KiB"
