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

"$router" --allowlist "$work/allowed-hosts" --log-format json --answer 10.9.8.7 --dns 127.0.1.1:5301 \
    --http 127.0.1.1:18080 --https 127.0.1.1:18443 --forward db.example.com:5432=127.0.1.1:15432 \
    --threads 1 2>"$work/router.log" &
pids+=($!)
router_pid=$!
# The same router with its default worker count (one per core).
"$router" --allowlist "$work/allowed-hosts" --log-format json --answer 10.9.8.7 --dns 127.0.1.3:5301 \
    --http 127.0.1.3:18080 --https 127.0.1.3:18443 --forward db.example.com:5432=127.0.1.3:15432 \
    2>"$work/router2.log" &
pids+=($!)
router2_pid=$!
# dnsmasq at its best for this job: answers from --address need no cache and no upstream; no query log.
# --address=/name/IP answers a name and its subdomains; /#/ with no address answers NXDOMAIN.
dnsmasq --no-daemon --conf-file=/dev/null --no-resolv --no-hosts --bind-interfaces \
    --listen-address=127.0.1.2 --port=5302 --user="$(id -un)" --pid-file= --cache-size=0 \
    --address=/api.anthropic.com/10.9.8.7 --address=/example.com/10.9.8.7 --address=/#/ \
    2>"$work/dnsmasq.log" &
pids+=($!)
dnsmasq_pid=$!
up() { dig +short +time=1 +tries=1 @"$1" -p "$2" api.anthropic.com >/dev/null 2>&1; }
for _ in $(seq 100); do
    up 127.0.1.1 5301 && up 127.0.1.3 5301 && up 127.0.1.2 5302 && break
    sleep 0.1
done

rss() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
echo "idle RSS: router $(rss "$router_pid") KiB, dnsmasq $(rss "$dnsmasq_pid") KiB"

declare -A server=([router]="127.0.1.1 5301" [router_mt]="127.0.1.3 5301" [dnsmasq]="127.0.1.2 5302")
declare -A samples
# One dnsperf run: NAME MODE -> "qps lost". MODE max: as fast as 200 outstanding queries allow; MODE
# paced: a fixed offered rate (PACED_QPS), where no query should be lost. dnsperf's own socket buffer is
# raised (-b) so that a reply burst is not dropped at the load generator's side and counted against the
# server.
run() {
    local addr port out rate=()
    read -r addr port <<<"${server[$1]}"
    [ "$2" = max ] || rate=(-Q "${PACED_QPS:-40000}")
    out=$(dnsperf -s "$addr" -p "$port" -d "$work/queries" -l "$secs" -c 4 -q 200 -b 4096 "${rate[@]}" 2>&1)
    echo "$(awk '/Queries per second/ {printf "%.0f", $4}' <<<"$out") $(awk '/Queries lost/ {print $3}' <<<"$out")"
}
rounds=${ROUNDS:-5}
order=(router router_mt dnsmasq)
for round in $(seq "$rounds"); do
    for k in 0 1 2; do
        who=${order[$(((round - 1 + k) % 3))]}
        for mode in max paced; do
            read -r qps lost <<<"$(run "$who" "$mode")"
            samples[$who,$mode,qps]+="$qps "
            samples[$who,$mode,lost]+="$lost "
        done
    done
done
median() { sort -n | awk '{v[NR] = $1} END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.0f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
range() { sort -n | awk 'NR == 1 {lo = $1} {hi = $1} END {print lo "–" hi}'; }
sum() { awk '{s += $1} END {print s + 0}'; }
# shellcheck disable=SC2086 # one sample per word
stat() { echo "$(printf '%s\n' ${samples[$1]} | median) ($(printf '%s\n' ${samples[$1]} | range))"; }
# shellcheck disable=SC2086
lost() { printf '%s\n' ${samples[$1]} | sum; }
echo
echo "| server | queries/s, max (lowest–highest) | lost, max (all rounds) | queries/s at ${PACED_QPS:-40000} offered | lost at ${PACED_QPS:-40000} offered (all rounds) |"
echo "|---|---:|---:|---:|---:|"
for who in router router_mt dnsmasq; do
    case $who in
        router) label="router \`--threads 1\`" ;;
        router_mt) label="router (default threads)" ;;
        dnsmasq) label="dnsmasq" ;;
    esac
    echo "| $label | $(stat "$who,max,qps") | $(lost "$who,max,lost") | $(stat "$who,paced,qps") | $(lost "$who,paced,lost") |"
done
# shellcheck disable=SC2086
m() { printf '%s\n' ${samples[$1,max,qps]} | median; }
echo
echo "Medians of $rounds interleaved rounds of ${secs} s (dnsperf -c 4 -q 200 -b 4096). Ratio router/dnsmasq: $(awk -v a="$(m router)" -v b="$(m dnsmasq)" 'BEGIN {printf "%.2f", a/b}'), default threads/dnsmasq: $(awk -v a="$(m router_mt)" -v b="$(m dnsmasq)" 'BEGIN {printf "%.2f", a/b}')."
echo "RSS after: router $(rss "$router_pid") KiB, router (default threads) $(rss "$router2_pid") KiB, dnsmasq $(rss "$dnsmasq_pid") KiB"
