#!/usr/bin/env bash
# Proxy benchmark: agent-sandbox-router (standalone) vs nginx (stream ssl_preread on 443, Host-routing
# proxy_pass on 80) vs connecting directly, against the same upstream, in one run; for bulk also socat,
# a plain relay to a fixed address, to show what relaying a stream costs here with nothing else done.
#
# The upstream is an nginx in a network namespace this script creates (198.18.0.2, RFC 2544 benchmarking
# range), reached over a veth pair: the router refuses to dial loopback by design. The name
# upstream.test resolves to it through a dnsmasq on loopback that only the router and the test clients
# use. Root only. Traffic stays on this machine. Usage: benches/proxy.sh [SECONDS] [OUT.md]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benches/lib.sh
. benches/lib.sh
secs=${1:-10}
out=${2:-/dev/stdout}
router=${ROUTER_BIN:-target/release/agent-sandbox-router}
[ -x "$router" ] || cargo build --release -p agent-sandbox-router
[ "$(id -u)" = 0 ] || { echo "benches/proxy.sh needs root (network namespace)" >&2; exit 1; }
for tool in nginx dnsmasq wrk curl openssl python3 unshare socat; do
    command -v "$tool" >/dev/null || { echo "missing $tool (make bench installs the tools)" >&2; exit 1; }
done

ns="asb-bench-$$"
veth="asbb$$"
work=$(mktemp -d)
chmod 755 "$work"
pids=()
socat_pids=()
trap bench_cleanup EXIT

# --- the upstream host ---------------------------------------------------------------------------
ip netns add "$ns"
ip link add "$veth" type veth peer name eth0 netns "$ns"
ip addr add 198.18.0.1/30 dev "$veth"
ip link set "$veth" up
ip -n "$ns" addr add 198.18.0.2/30 dev eth0
# One more upstream address per contender, so one contender's TIME_WAIT sockets toward the upstream
# never exhaust the ports of the next.
ip -n "$ns" addr add 198.18.0.5/32 dev eth0
ip -n "$ns" addr add 198.18.0.6/32 dev eth0
ip -n "$ns" addr add 198.18.0.7/32 dev eth0
ip route add 198.18.0.5/32 dev "$veth"
ip route add 198.18.0.6/32 dev "$veth"
ip route add 198.18.0.7/32 dev "$veth"
ip -n "$ns" link set eth0 up
ip -n "$ns" link set lo up

openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=upstream.test \
    -addext subjectAltName=DNS:upstream.test -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
mkdir -p "$work/www"
echo "hello from upstream" >"$work/www/small"
truncate -s 1G "$work/www/bulk"

mime=/etc/nginx/mime.types
[ -f "$mime" ] || mime=/dev/null
upstream_nginx "$ns" "$work"

# --- name service for upstream.test --------------------------------------------------------------
# The router resolves upstream.test to 198.18.0.5, nginx to 198.18.0.6; clients going direct use .2.
dnsmasq --no-daemon --conf-file=/dev/null --no-resolv --no-hosts --bind-interfaces \
    --listen-address=127.0.3.1 --port=5353 --user="$(id -un)" --pid-file= \
    --local-ttl=300 --address=/upstream.test/198.18.0.5 --address=/#/ 2>"$work/resolver.log" &
pids+=($!)
dnsmasq --no-daemon --conf-file=/dev/null --no-resolv --no-hosts --bind-interfaces \
    --listen-address=127.0.3.2 --port=5353 --user="$(id -un)" --pid-file= \
    --local-ttl=300 --address=/upstream.test/198.18.0.6 --address=/#/ 2>"$work/resolver2.log" &
pids+=($!)

# --- the contenders ------------------------------------------------------------------------------
printf 'upstream.test\n' >"$work/allowed-hosts"
# Each router runs in a session of its own (setsid), as nginx does once it daemonizes: with the kernel's
# autogroup scheduling a session is a scheduling group, and a router left in this script's session would
# share one with wrk's busy threads while nginx has its own. (Not shown to change the figures: BENCHMARKS.md.)
setsid "$router" --allowlist "$work/allowed-hosts" --log-format json --answer 127.0.1.1 --dns 127.0.1.1:5301 \
    --http 127.0.1.1:80 --https 127.0.1.1:443 --resolver 127.0.3.1:5353 --max-connections 20000 \
    --threads 1 2>"$work/router.log" &
pids+=($!)
router_pid=$!
# The same router with its default worker count (one per core), to pick the default by measurement.
setsid "$router" --allowlist "$work/allowed-hosts" --log-format json --answer 127.0.1.2 --dns 127.0.1.2:5301 \
    --http 127.0.1.2:80 --https 127.0.1.2:443 --resolver 127.0.3.1:5353 --max-connections 20000 \
    2>"$work/router2.log" &
pids+=($!)
router2_pid=$!

proxy_nginx_conf "$work" 127.0.2.1 127.0.3.2:5353
nginx -c "$work/nginx-px.conf" -e "$work/nginx-px.err"
# socat, for the bulk rows only: a plain relay to one fixed address (no name routing, no parsing; the
# design the router replaces used it as the in-sandbox forwarder), so what relaying a stream costs on this
# machine with nothing else done. A child per connection, one buffer of 1 MiB: its fastest of 8 KiB (its
# default), 128 KiB and 1 MiB here (1 GiB over HTTP, 2 runs each: 0.3-0.6, 0.9-1.1 and 1.5-1.6 GB/s).
# Unlike the others' bulk runs, socat's do not follow 15 s of wrk load in the same slot of the round.
for port in 80 443; do
    socat -b 1048576 "TCP-LISTEN:$port,bind=127.0.4.1,reuseaddr,fork,backlog=64" "TCP:198.18.0.7:$port" &
    pids+=($!)
    socat_pids+=($!)
done
dnsmasq --no-daemon --conf-file=/dev/null --no-resolv --no-hosts --bind-interfaces \
    --listen-address=127.0.2.1 --port=5302 --user="$(id -un)" --pid-file= \
    --address=/upstream.test/127.0.2.1 --address=/#/ 2>"$work/dnsmasq.log" &
pids+=($!)
dnsmasq_pid=$!

ready() { curl -sk --max-time 2 --resolve "upstream.test:443:$1" https://upstream.test/small >/dev/null; }
for _ in $(seq 100); do
    ready 127.0.1.1 && ready 127.0.1.2 && ready 127.0.2.1 && ready 198.18.0.2 && ready 127.0.4.1 && break
    sleep 0.1
done
ready 127.0.1.1 || { echo "router not ready:"; cat "$work/router.log"; exit 1; } >&2
ready 127.0.1.2 || { echo "router (default threads) not ready:"; cat "$work/router2.log"; exit 1; } >&2
ready 127.0.2.1 || { echo "nginx not ready:"; cat "$work/nginx-px.err"; exit 1; } >&2
ready 198.18.0.2 || { echo "the upstream (direct) not ready:"; cat "$work/nginx-up.err"; exit 1; } >&2
ready 127.0.4.1 || { echo "socat not ready"; exit 1; } >&2

declare -A target=([router]=127.0.1.1 [router_mt]=127.0.1.2 [nginx]=127.0.2.1 [direct]=198.18.0.2 [socat]=127.0.4.1)


pids_rss() { # sum VmRSS (KiB) of the given pids
    local total=0 p
    for p in "$@"; do
        total=$((total + $(awk '/VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)))
    done
    echo "$total"
}
# socat_ticks: the socat listeners' CPU with their finished children's (utime + stime + cutime + cstime),
# once no child is left: a child's time is added to its parent's when the parent reaps it.
socat_ticks() {
    local p left
    for _ in $(seq 100); do
        left=0
        for p in "${socat_pids[@]}"; do pgrep -P "$p" >/dev/null && left=1; done
        [ "$left" = 0 ] && break
        sleep 0.05
    done
    # A child still there after 5 s would put its CPU into a later sample: say so.
    [ "$left" = 0 ] || echo "socat: a relay child outlived its connection by 5 s; its CPU lands in a later sample" >&2
    stat_ticks "14 15 16 17" "${socat_pids[@]}"
}
nginx_pids() { pgrep -f "nginx.*$work/nginx-px.conf" ; pgrep -P "$(cat "$work/nginx-px.pid")"; }

# The proxy's own CPU (user + system) per new connection over one run, in microseconds: less sensitive to
# the load generator sharing the cores than the rate itself.
cpu_per_conn() { # ticks_before ticks_after rate
    awk -v t="$(($2 - $1))" -v hz="$(getconf CLK_TCK)" -v r="$3" -v s="$secs" \
        'BEGIN { if (r > 0) printf "%.0f", t / hz * 1e6 / (r * s) }'
}

# Each measure runs ROUNDS times (default 5; keep it a multiple of 5, so each contender runs equally often
# in each place), the contenders in a rotating order, and the median with its spread (lowest and highest
# sample) is reported: one contender never always goes first (cold caches) or last (a warm machine), a
# noisy second on the shared cores moves one sample, not the result, and a difference smaller than the
# spread is visibly noise.
rounds=${ROUNDS:-5}
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
# Netfilter's connection tracking, if a firewall table in this namespace uses it (podman's netavark loads
# one), adds its cost to every new connection here, direct and relayed: the report says whether it ran.
conntrack_count() { cat /proc/sys/net/netfilter/nf_conntrack_count 2>/dev/null || echo -; }
conntrack_before=$(conntrack_count)
: >"$work/wrk.all"
order=(router router_mt nginx direct socat)
declare -A samples
add() { samples[$1]+="$2 "; }
proxy_pids_of() { # who -> the proxy's pids (none for direct)
    case $1 in
        router) echo "$router_pid" ;;
        router_mt) echo "$router2_pid" ;;
        nginx) nginx_pids | sort -u ;;
    esac
}
# new_conns WHO IP SCHEME KEY [WRK_SHAPE...]: one run of new connections (wrk -t2 -c32 unless a shape is
# given, Connection: close); records their rate, and per connection the proxy's CPU (all, and its system
# part) and the whole machine's CPU.
new_conns() {
    local who=$1 ip=$2 scheme=$3 key=$4 c0 s0 m0 c1 s1 m1 rate
    shift 4
    [ $# -gt 0 ] || set -- -t2 -c32
    c0=$(cpu_ticks "${proxy_pids[@]}")
    s0=$(sys_ticks "${proxy_pids[@]}")
    m0=$(machine_ticks)
    rate=$(wrk_at "$ip" "$scheme://upstream.test/small" "$@" -d"${secs}s" -H 'Connection: close' | rps)
    no_rate "$rate" "$who" "$key"
    c1=$(cpu_ticks "${proxy_pids[@]}")
    s1=$(sys_ticks "${proxy_pids[@]}")
    m1=$(machine_ticks)
    add "$who,$key" "$rate"
    add "$who,${key}_machine" "$(cpu_per_conn "$m0" "$m1" "$rate")"
    add "$who,${key}_busy" "$(busy_cores "$m0" "$m1" "$secs")"
    [ "$who" = direct ] && return
    add "$who,${key}_cpu" "$(cpu_per_conn "$c0" "$c1" "$rate")"
    add "$who,${key}_sys" "$(cpu_per_conn "$s0" "$s1" "$rate")"
}
bulk_ticks() { if [ "$1" = socat ]; then socat_ticks; else cpu_ticks "${proxy_pids[@]}"; fi; }
# bulk WHO IP SCHEME KEY: the 1 GiB file once; records MiB/s, the proxy's CPU for it in ms, and the whole
# machine's CPU for it in ms with the cores it kept busy: what the transfer cost every process together
# (curl, the upstream, the proxy, the kernel's network processing wherever it ran), direct included.
bulk() {
    local who=$1 ip=$2 scheme=$3 key=$4 c0 c1 m0 m1 t0 t1 bps
    c0=$(bulk_ticks "$who")
    t0=$(date +%s%N)
    m0=$(machine_ticks)
    bps=$(curl -sk -o /dev/null --resolve "upstream.test:80:$ip" --resolve "upstream.test:443:$ip" \
        -w '%{speed_download}' "$scheme://upstream.test/bulk")
    m1=$(machine_ticks)
    t1=$(date +%s%N)
    c1=$(bulk_ticks "$who")
    add "$who,$key" "$(awk -v b="$bps" 'BEGIN {printf "%.0f", b / 1048576}')"
    add "$who,${key}_machine" \
        "$(awk -v t="$((m1 - m0))" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.0f", t / hz * 1000}')"
    # Over the same window as the machine's ticks (curl's start and exit included).
    add "$who,${key}_busy" "$(busy_cores "$m0" "$m1" "$(awk -v n="$((t1 - t0))" 'BEGIN {print n / 1e9}')")"
    [ "$who" = direct ] || add "$who,${key}_cpu" \
        "$(awk -v t="$((c1 - c0))" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.0f", t / hz * 1000}')"
}
# The bulk file is read once first so no contender pays for the upstream's cold page cache.
curl -s -o /dev/null --resolve "upstream.test:80:198.18.0.2" http://upstream.test/bulk
for round in $(seq "$rounds"); do
    for k in 0 1 2 3 4; do
        # Rotated each round: over 5 rounds each contender runs once in each of the 5 places.
        who=${order[$(((round - 1 + k) % 5))]}
        ip=${target[$who]}
        if [ "$who" = socat ]; then
            bulk socat "$ip" http bulk
            bulk socat "$ip" https bulk_tls
            continue
        fi
        rate=$(wrk_at "$ip" https://upstream.test/small -t2 -c64 -d"${secs}s" | rps)
        no_rate "$rate" "$who" https_keepalive
        add "$who,https_keepalive" "$rate"
        mapfile -t proxy_pids < <(proxy_pids_of "$who")
        new_conns "$who" "$ip" https https_new
        # A session's load: a few connections at a time, where each wake-up carries one connection's step.
        new_conns "$who" "$ip" https https_new4 -t1 -c4
        perf_pid=
        if [ -n "${PROFILE:-}" ] && [ "$who" = router ] && [ "$round" = 1 ]; then
            # PROFILE=FILE: a perf profile of the router during its first new-HTTP-connections run.
            perf record -F 999 -g -p "$router_pid" -o "$PROFILE" -- sleep "$secs" >/dev/null 2>&1 &
            perf_pid=$!
        fi
        new_conns "$who" "$ip" http http_new
        [ -z "$perf_pid" ] || wait "$perf_pid" || true
        # The proxy's CPU per GiB relayed, in milliseconds (the file is exactly 1 GiB): over HTTP and over
        # HTTPS (relayed encrypted, as it comes: the router's relay, nginx's stream module; the client
        # decrypts).
        bulk "$who" "$ip" http bulk
        bulk "$who" "$ip" https bulk_tls
    done
done
# Every measure, in the report's order (the table and the samples list both walk it).
measures=(https_keepalive https_new https_new4 http_new bulk bulk_tls https_new_cpu https_new_sys https_new4_cpu
    http_new_cpu http_new_sys bulk_cpu bulk_tls_cpu https_new_machine https_new_busy https_new4_machine
    https_new4_busy http_new_machine http_new_busy bulk_machine bulk_busy bulk_tls_machine bulk_tls_busy)
declare -A result spread
summarise

conntrack_after=$(conntrack_count)
# RSS idle (after the load, sockets closed) and with 1,000 open TLS connections.
idle_router=$(pids_rss "$router_pid")
# shellcheck disable=SC2046
idle_nginx=$(pids_rss $(nginx_pids | sort -u) "$dnsmasq_pid")
hold() { # ip: opens 1000 TLS connections through the proxy, prints "open" and holds them until stdin closes
    python3 - "$1" <<'PY'
import asyncio, ssl, sys
ip = sys.argv[1]
async def main():
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    conns = []
    for _ in range(10):
        batch = await asyncio.gather(*[asyncio.open_connection(ip, 443, ssl=ctx, server_hostname="upstream.test") for _ in range(100)])
        conns.extend(batch)
    print("open", len(conns), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
asyncio.run(main())
PY
}
measure_hold() { # ip pids...
    local ip=$1 fifo="$work/hold.fifo" rss
    shift
    rm -f "$fifo"
    mkfifo "$fifo"
    hold "$ip" <"$fifo" >"$work/hold.out" &
    local hp=$!
    exec 9>"$fifo"
    for _ in $(seq 300); do grep -q '^open 1000' "$work/hold.out" 2>/dev/null && break; sleep 0.1; done
    grep -q '^open 1000' "$work/hold.out" || { echo "could not open 1000 connections via $ip" >&2; }
    rss=$(pids_rss "$@")
    exec 9>&-
    wait "$hp" || true
    echo "$rss"
}
ulimit -n 20000
busy_router=$(measure_hold 127.0.1.1 "$router_pid")
# shellcheck disable=SC2046
busy_nginx=$(measure_hold 127.0.2.1 $(nginx_pids | sort -u) "$dnsmasq_pid")

# label_of MEASURE: its row label in the report.
label_of() {
    case $1 in
        https_keepalive) echo "HTTPS requests/s, kept-alive (wrk -c64)" ;;
        https_new) echo "new HTTPS connections/s (wrk -c32, Connection: close)" ;;
        https_new4) echo "new HTTPS connections/s, four at a time (wrk -t1 -c4, Connection: close)" ;;
        http_new) echo "new HTTP connections/s (wrk -c32, Connection: close)" ;;
        bulk) echo "bulk 1 GiB over HTTP, MiB/s (curl)" ;;
        bulk_tls) echo "bulk 1 GiB over HTTPS, MiB/s (curl)" ;;
        https_new_cpu) echo "proxy CPU per new HTTPS connection, µs (lower is better)" ;;
        https_new_sys) echo "… of which in the kernel (system time), µs" ;;
        https_new4_cpu) echo "proxy CPU per new HTTPS connection, four at a time, µs (lower is better)" ;;
        http_new_cpu) echo "proxy CPU per new HTTP connection, µs (lower is better)" ;;
        http_new_sys) echo "… of which in the kernel (system time), µs" ;;
        bulk_cpu) echo "proxy CPU per GiB relayed over HTTP, ms (lower is better)" ;;
        bulk_tls_cpu) echo "proxy CPU per GiB relayed over HTTPS, ms (lower is better)" ;;
        https_new_machine) echo "whole machine's CPU per new HTTPS connection, µs" ;;
        https_new4_machine) echo "whole machine's CPU per new HTTPS connection, four at a time, µs" ;;
        https_new4_busy) echo "cores busy during the new HTTPS connections run, four at a time (of $(nproc))" ;;
        http_new_machine) echo "whole machine's CPU per new HTTP connection, µs" ;;
        https_new_busy) echo "cores busy during the new HTTPS connections run (of $(nproc))" ;;
        http_new_busy) echo "cores busy during the new HTTP connections run (of $(nproc))" ;;
        bulk_machine) echo "whole machine's CPU per GiB over HTTP, ms" ;;
        bulk_busy) echo "cores busy during the bulk transfer over HTTP (of $(nproc))" ;;
        bulk_tls_machine) echo "whole machine's CPU per GiB over HTTPS, ms" ;;
        bulk_tls_busy) echo "cores busy during the bulk transfer over HTTPS (of $(nproc))" ;;
    esac
}
{
    echo "Machine: $(machine_desc);"
    echo "router $(git describe --always --dirty 2>/dev/null || echo unknown) ($router, $(sha256sum "$router" | cut -c1-12));"
    echo "load average before the run: $load_before."
    # Entries expire (TIME_WAIT's after 120 s), so only growth says it tracked this run's connections.
    if [ "$conntrack_before" = - ] || [ "$conntrack_after" = - ]; then
        echo "Netfilter connection tracking: not loaded."
    elif [ "$conntrack_after" -gt $((conntrack_before + 1000)) ]; then
        echo "Netfilter connection tracking: active (entries $conntrack_before before the rounds, $conntrack_after after): every connection of the run was tracked."
    else
        echo "Netfilter connection tracking: loaded, not seen tracking this run (entries $conntrack_before before the rounds, $conntrack_after after)."
    fi
    echo
    echo "| measure | router \`--threads 1\` | router (default threads) | nginx | direct | socat (bulk only) | router/nginx | router default/nginx | router/direct | socat/direct |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for m in "${measures[@]}"; do
        label=$(label_of "$m")
        r=${result[router,$m]:--} t=${result[router_mt,$m]:--} n=${result[nginx,$m]:--} d=${result[direct,$m]:--}
        o=${result[socat,$m]:--}
        echo "| $label | $(cell "router,$m") | $(cell "router_mt,$m") | $(cell "nginx,$m") | $(cell "direct,$m") | $(cell "socat,$m") | $(ratio "$r" "$n") | $(ratio "$t" "$n") | $(ratio "$r" "$d") | $(ratio "$o" "$d") |"
    done
    echo
    echo "The ratios above are ratios of the medians. Paired, the median of the per-round ratios (lowest–highest):"
    echo "each contender's sample against the other's from the same round, so a round that was slower for"
    echo "everyone moves both sides of its ratio."
    echo
    echo "| measure | router/nginx | router default/nginx | router/direct | router default/direct | socat/direct |"
    echo "|---|---:|---:|---:|---:|---:|"
    for m in "${measures[@]}"; do
        case $m in *_busy | *_machine) continue ;; esac
        echo "| $(label_of "$m") | $(paired router nginx "$m") | $(paired router_mt nginx "$m") | $(paired router direct "$m") | $(paired router_mt direct "$m") | $(paired socat direct "$m") |"
    done
    echo
    echo "wrk's own error counts over every run (answers other than 2xx/3xx; socket errors):" \
        "$(wrk_errors "$work/wrk.all")."
    echo
    echo "Medians of $rounds rounds of ${secs} s (lowest–highest sample in brackets), the contenders in rotating"
    echo "order. Samples (router / router default threads / nginx / direct / socat):"
    echo
    for m in "${measures[@]}"; do
        r=${samples[router,$m]:-} t=${samples[router_mt,$m]:-} n=${samples[nginx,$m]:-} d=${samples[direct,$m]:--}
        o=${samples[socat,$m]:--}
        echo "- $m: ${r% } / ${t% } / ${n% } / ${d% } / ${o% }"
    done
    echo
    echo "| RSS (KiB) | router | nginx + dnsmasq | router / (nginx + dnsmasq) |"
    echo "|---|---:|---:|---:|"
    echo "| idle (after load) | $idle_router | $idle_nginx | $(ratio "$idle_router" "$idle_nginx") |"
    echo "| 1,000 open TLS connections | $busy_router | $busy_nginx | $(ratio "$busy_router" "$busy_nginx") |"
    echo
    echo "nginx $(nginx -v 2>&1 | sed 's/^nginx version: //') ran with this configuration (the run's temporary directory shown as \$work);"
    echo "the names resolve through a dnsmasq with --local-ttl=300, as the router's do:"
    echo
    echo '```nginx'
    sed "s|$work|\$work|g" "$work/nginx-px.conf"
    echo '```'
} >"$out"
[ "$out" = /dev/stdout ] || cat "$out"
