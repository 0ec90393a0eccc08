#!/usr/bin/env bash
# A/B of two router binaries on the costs a change to the hot path moves: the router's CPU time and
# system calls per DNS query, per new HTTP and HTTPS connection and per kept-alive HTTPS request, and its
# CPU per GiB relayed. The binaries run alternately (A, B, A, B, ...), ROUNDS times each, one worker
# each, against the same upstream nginx in a network namespace of this script's own (no default route),
# so a difference larger than the spread of the samples is the change, not the machine. CPU and system
# calls per unit of work move much less than rates when other processes share the cores.
#
# Usage: benches/ab.sh ROUTER_A ROUTER_B [SECONDS]   (root: network namespace; needs nginx, dnsmasq,
# dnsperf, wrk, curl, perf). Traffic stays on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: benches/ab.sh ROUTER_A ROUTER_B [SECONDS]" >&2; exit 2; }
bins=("$1" "$2")
secs=${3:-4}
rounds=${ROUNDS:-3}
[ "$(id -u)" = 0 ] || { echo "benches/ab.sh needs root (network namespace)" >&2; exit 1; }
for tool in nginx dnsmasq dnsperf wrk curl perf openssl unshare; do
    command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 1; }
done
for b in "${bins[@]}"; do [ -x "$b" ] || { echo "not an executable: $b" >&2; exit 1; }; done
# shellcheck source=benches/lib.sh
. benches/lib.sh

ns="asb-ab-$$"
veth="asbab$$"
work=$(mktemp -d)
chmod 755 "$work"
pids=()
trap bench_cleanup EXIT

upstream_netns "$ns" "$veth" 198.18.4.1/30 198.18.4.2/30
upstream_cert "$work"
mkdir -p "$work/www"
echo "hello from upstream" >"$work/www/small"
truncate -s 256M "$work/www/bulk"
upstream_nginx "$ns" "$work"
dnsmasq --no-daemon --conf-file=/dev/null --no-resolv --no-hosts --bind-interfaces \
    --listen-address=127.0.3.11 --port=5353 --user="$(id -un)" --pid-file= --local-ttl=300 \
    --address=/upstream.test/198.18.4.2 --address=/#/ 2>"$work/resolver.log" &
pids+=($!)
printf 'upstream.test\n.example.test\n' >"$work/allowed-hosts"
echo "127.0.1.12 upstream.test" >"$work/hosts"
for i in $(seq 1 500); do
    echo "upstream.test A"
    echo "host$i.example.test A"
    echo "host$i.evil.test A"
    echo "x$i.exfil.test A"
done >"$work/queries"

hz=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# counted PID CMD...: runs CMD while perf counts PID's system calls; prints "ticks syscalls".
counted() {
    local pid=$1 t0 t1
    shift
    t0=$(ticks "$pid")
    perf stat -e raw_syscalls:sys_enter -p "$pid" -x, -o "$work/perf" -- "$@" >"$work/out" 2>&1
    t1=$(ticks "$pid")
    echo "$((t1 - t0)) $(awk -F, '/raw_syscalls/ {print $1}' "$work/perf")"
}
# wrk with upstream.test pointing at the router under test (wrk has no --resolve), as one command perf
# can run: "${wrk_here[@]}" ARGS...
# shellcheck disable=SC2016 # expanded by the inner shell
wrk_here=(unshare --mount sh -c 'mount --bind "$1" /etc/hosts && shift && exec wrk "$@"' sh "$work/hosts")
per() { awk -v t="$1" -v s="$2" -v n="$3" -v hz="$hz" -v scale="$4" \
    'BEGIN { if (n > 0) printf "%.2f %.1f", t / hz * scale / n, s / n; else print "- -" }'; }

declare -A samples
add() { samples[$1]+="$2 "; }
for _ in $(seq "$rounds"); do
    for which in 0 1; do
        bin=${bins[$which]}
        "$bin" --allowlist "$work/allowed-hosts" --log-format json --answer 127.0.1.12 --dns 127.0.1.12:5301 \
            --http 127.0.1.12:80 --https 127.0.1.12:443 --resolver 127.0.3.11:5353 \
            --max-connections 20000 --threads 1 2>"$work/router.log" &
        pid=$!
        for _ in $(seq 100); do
            curl -s --max-time 1 --resolve upstream.test:80:127.0.1.12 http://upstream.test/small >/dev/null && break
            sleep 0.1
        done
        read -r t s <<<"$(counted "$pid" dnsperf -s 127.0.1.12 -p 5301 -d "$work/queries" -l "$secs" -c 4 -q 200 -b 4096)"
        n=$(awk '/Queries completed/ {print $3}' "$work/out")
        read -r c y <<<"$(per "$t" "$s" "$n" 1e6)"
        add "$which,dns_cpu" "$c"
        add "$which,dns_sys" "$y"
        for kind in http https; do
            read -r t s <<<"$(counted "$pid" "${wrk_here[@]}" -t2 -c32 -d"${secs}s" -H 'Connection: close' "$kind://upstream.test/small")"
            n=$(awk '/requests in/ {print $1}' "$work/out")
            read -r c y <<<"$(per "$t" "$s" "$n" 1e6)"
            add "$which,${kind}_new_cpu" "$c"
            add "$which,${kind}_new_sys" "$y"
        done
        read -r t s <<<"$(counted "$pid" "${wrk_here[@]}" -t2 -c64 -d"${secs}s" https://upstream.test/small)"
        n=$(awk '/requests in/ {print $1}' "$work/out")
        read -r c y <<<"$(per "$t" "$s" "$n" 1e6)"
        add "$which,keepalive_cpu" "$c"
        add "$which,keepalive_sys" "$y"
        read -r t s <<<"$(counted "$pid" curl -s -o /dev/null --resolve upstream.test:80:127.0.1.12 http://upstream.test/bulk)"
        add "$which,bulk_cpu" "$(awk -v t="$t" -v hz="$hz" 'BEGIN {printf "%.0f", t / hz * 1000 * 4}')"
        kill "$pid"
        wait "$pid" 2>/dev/null || true
    done
done

median_exact() { # unrounded, unlike lib.sh's median
    sort -n | awk '{v[NR] = $1} END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
cell() { # shellcheck disable=SC2086 # one sample per word
    echo "$(printf '%s\n' ${samples[$1]} | median_exact) (${samples[$1]% })"
}
echo "A: ${bins[0]}"
echo "B: ${bins[1]}"
echo
echo "| router, per unit of work (lower is better) | A | B |"
echo "|---|---:|---:|"
for m in dns_cpu dns_sys http_new_cpu http_new_sys https_new_cpu https_new_sys keepalive_cpu keepalive_sys bulk_cpu; do
    case $m in
        dns_cpu) label="CPU per DNS query, µs" ;;
        dns_sys) label="system calls per DNS query" ;;
        http_new_cpu) label="CPU per new HTTP connection, µs" ;;
        http_new_sys) label="system calls per new HTTP connection" ;;
        https_new_cpu) label="CPU per new HTTPS connection, µs" ;;
        https_new_sys) label="system calls per new HTTPS connection" ;;
        keepalive_cpu) label="CPU per kept-alive HTTPS request, µs" ;;
        keepalive_sys) label="system calls per kept-alive HTTPS request" ;;
        bulk_cpu) label="CPU per GiB relayed, ms" ;;
    esac
    echo "| $label | $(cell "0,$m") | $(cell "1,$m") |"
done
echo
echo "Medians of $rounds alternating runs of ${secs} s each (samples in brackets); one worker per router."
