#!/usr/bin/env bash
# Router RSS with 10,000 idle client connections spread over 100 client addresses, as a gateway sees them.
#
# Two network namespaces this script creates, joined by a veth pair, no default route in either:
#   server side: the router on 198.18.0.1 (DNS, HTTP, TLS) and a dnsmasq on its loopback resolving
#                upstream.test to the upstream;
#   client side: the 100 client addresses 198.18.1.1-198.18.1.100 and the upstream nginx on 198.18.2.1.
# Two phases, each with a freshly started router so the first's freed memory cannot hide the second's:
#   1. 10,000 TCP connections that connect and send nothing (the router holds each waiting for a
#      ClientHello: one socket each; --peek-timeout is raised above the measurement);
#   2. established TLS relays that then go idle (the router holds two sockets each: the client's and the
#      upstream's), as many as the router's open-file limit allows, up to 10,000.
# Root only. Traffic stays inside the two namespaces. Usage: benches/rss.sh [OUT.md]   (CONNS=N to change)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/dev/stdout}
conns=${CONNS:-10000}
clients=100
router=${ROUTER_BIN:-target/release/agent-sandbox-router}
[ -x "$router" ] || cargo build --release --locked -p agent-sandbox-router
[ "$(id -u)" = 0 ] || { echo "benches/rss.sh needs root (network namespaces)" >&2; exit 1; }
for tool in nginx dnsmasq curl openssl python3; do
    command -v "$tool" >/dev/null || { echo "missing $tool (make bench installs the tools)" >&2; exit 1; }
done
[ $((conns % clients)) = 0 ] || { echo "CONNS must be a multiple of $clients" >&2; exit 1; }
per=$((conns / clients))

srv="asb-rss-srv-$$"
cli="asb-rss-cli-$$"
work=$(mktemp -d)
chmod 755 "$work"
pids=()
router_pid=
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
    for p in "${pids[@]}" ${router_pid:+"$router_pid"}; do kill "$p" 2>/dev/null || true; done
    if [ -f "$work/nginx-up.pid" ]; then kill "$(cat "$work/nginx-up.pid")" 2>/dev/null || true; fi
    ip netns del "$srv" 2>/dev/null || true
    ip netns del "$cli" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

ip netns add "$srv"
ip netns add "$cli"
ip link add eth0 netns "$srv" type veth peer name eth0 netns "$cli"
ip -n "$srv" addr add 198.18.0.1/16 dev eth0
for i in $(seq 1 "$clients"); do ip -n "$cli" addr add "198.18.1.$i/16" dev eth0; done
ip -n "$cli" addr add 198.18.2.1/16 dev eth0
for n in "$srv" "$cli"; do
    ip -n "$n" link set lo up
    ip -n "$n" link set eth0 up
done

# --- the upstream, in the client namespace -----------------------------------------------------------
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=upstream.test \
    -addext subjectAltName=DNS:upstream.test -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
mkdir -p "$work/www"
echo "hello from upstream" >"$work/www/small"
cat >"$work/nginx-up.conf" <<EOF
worker_processes 1;
worker_rlimit_nofile 20000;
pid $work/nginx-up.pid;
error_log $work/nginx-up.err warn;
events { worker_connections 19000; }
http {
    access_log off;
    # Idle relays carry no request: nginx must not close them while they are being counted.
    client_header_timeout 600s;
    keepalive_timeout 600s;
    server {
        listen 198.18.2.1:443 ssl backlog=4096;
        ssl_certificate $work/cert.pem;
        ssl_certificate_key $work/key.pem;
        root $work/www;
    }
}
EOF
ip netns exec "$cli" nginx -c "$work/nginx-up.conf" -e "$work/nginx-up.err"

ip netns exec "$srv" dnsmasq --no-daemon --conf-file=/dev/null --no-resolv --no-hosts --bind-interfaces \
    --listen-address=127.0.0.1 --port=5353 --user="$(id -un)" --pid-file= \
    --local-ttl=300 --address=/upstream.test/198.18.2.1 --address=/#/ 2>"$work/resolver.log" &
pids+=($!)

# --- the router --------------------------------------------------------------------------------------
printf 'upstream.test\n' >"$work/allowed-hosts"
# Room for all clients and 10% more; per client, the 100 connections each client holds and 10% more.
max=$((conns + conns / 10))
per_client=$((per + per / 10))
extra=()
if "$router" --help | grep -q -- '--max-connections-per-client'; then
    extra+=(--max-connections-per-client "$per_client")
    caps="--max-connections $max --max-connections-per-client $per_client"
else
    caps="--max-connections $max (this build has no --max-connections-per-client)"
fi
[ -z "${ROUTER_THREADS:-}" ] || extra+=(--threads "$ROUTER_THREADS")
start_router() {
    ip netns exec "$srv" "$router" --allowlist "$work/allowed-hosts" --log-format json --answer 198.18.0.1 \
        --dns 198.18.0.1:53 --http 198.18.0.1:80 --https 198.18.0.1:443 --resolver 127.0.0.1:5353 \
        --max-connections "$max" --peek-timeout 600 "${extra[@]}" 2>>"$work/router.log" &
    router_pid=$!
    local _
    for _ in $(seq 100); do
        ip netns exec "$cli" curl -sk --max-time 2 --resolve upstream.test:443:198.18.0.1 \
            https://upstream.test/small >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    { echo "router not ready:"; cat "$work/router.log"; } >&2
    exit 1
}
stop_router() {
    kill "$router_pid"
    wait "$router_pid" 2>/dev/null || true
    router_pid=
}
rss() { awk '/VmRSS/ {print $2}' "/proc/$router_pid/status"; }
fds() { find "/proc/$router_pid/fd" -mindepth 1 -maxdepth 1 | wc -l; }

# Opens the connections, waits until the router holds them all (its open files, polled), and prints
# "open failed rss_before rss_with seconds_to_open".
measure() { # mode per-client sockets-per-connection
    local mode=$1 n=$(($2 * clients)) per_conn=$3 fifo="$work/hold.fifo" base_rss base_fds t0 t1 with_rss
    start_router
    base_rss=$(rss)
    base_fds=$(fds)
    rm -f "$fifo" "$work/hold.out"
    mkfifo "$fifo"
    t0=$(date +%s.%N)
    ip netns exec "$cli" python3 benches/idle_conns.py --ip 198.18.0.1 --port 443 --first 198.18.1.1 \
        --count "$clients" --per "$2" --mode "$mode" <"$fifo" >"$work/hold.out" 2>>"$work/hold.err" &
    local hp=$!
    exec 9>"$fifo"
    local _
    for _ in $(seq 1200); do
        grep -q '^open' "$work/hold.out" 2>/dev/null && [ "$(fds)" -ge $((base_fds + n * per_conn)) ] && break
        kill -0 "$hp" 2>/dev/null || break
        sleep 0.1
    done
    t1=$(date +%s.%N)
    # Let the allocator and lazily touched pages settle before reading RSS.
    sleep 1
    with_rss=$(rss)
    read -r _ opened _ failed _ <"$work/hold.out" || true
    held=$((($(fds) - base_fds) / per_conn))
    exec 9>&-
    wait "$hp" || true
    stop_router
    echo "${opened:-0} ${failed:-?} $held $base_rss $with_rss $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}')"
}

# Each relay costs the router two descriptors: fit them under its hard limit, with room for the rest.
hard=$(ulimit -Hn)
ulimit -n "$hard"
relay_per=$per
if [ $((conns * 2 + 200)) -gt "$hard" ]; then relay_per=$(((hard - 200) / 2 / clients)); fi

# In this shell, not a subshell: the router it starts must stay within reach of the cleanup trap.
measure tcp "$per" 1 >"$work/tcp.res"
measure tls "$relay_per" 2 >"$work/tls.res"
read -r tcp_open tcp_failed tcp_held tcp_before tcp_with tcp_secs <"$work/tcp.res"
read -r tls_open tls_failed tls_held tls_before tls_with tls_secs <"$work/tls.res"

kib_per() { awk -v a="$1" -v b="$2" -v n="$3" 'BEGIN { if (n > 0) printf "%.1f", (b - a) / n; else print "n/a" }'; }
{
    echo "Router: \`$caps --peek-timeout 600\`${ROUTER_THREADS:+ --threads $ROUTER_THREADS}, a fresh process per row;"
    echo "$clients client addresses, connections opened round-robin over them, $(ulimit -Hn) open files at most."
    echo "The TLS listener defers the accept until a connection's first bytes are in (README, Bounds): the silent"
    echo "TCP connections reach the router about 1 s after they connect (past 1,024 at once as SYN cookies, not"
    echo "deferred), and the row is read once the router holds them all."
    echo
    echo "| idle connections | opened / failed | held by the router | RSS before, KiB | RSS with them, KiB | KiB per connection | s to open |"
    echo "|---|---:|---:|---:|---:|---:|---:|"
    echo "| TCP, nothing sent (waiting for a ClientHello) | $tcp_open / $tcp_failed | $tcp_held | $tcp_before | $tcp_with | $(kib_per "$tcp_before" "$tcp_with" "$tcp_held") | $tcp_secs |"
    echo "| TLS relays, established then idle | $tls_open / $tls_failed | $tls_held | $tls_before | $tls_with | $(kib_per "$tls_before" "$tls_with" "$tls_held") | $tls_secs |"
} >"$out"
[ "$out" = /dev/stdout ] || cat "$out"
status=0
[ "$tcp_held" -ge "$conns" ] || { echo "rss bench: the router held $tcp_held of $conns idle TCP connections" >&2; status=1; }
[ "$tls_held" -ge $((relay_per * clients)) ] || { echo "rss bench: the router held $tls_held of $((relay_per * clients)) relays" >&2; status=1; }
if [ "$status" != 0 ]; then
    { echo "--- client"; cat "$work/hold.err" 2>/dev/null; echo "--- router log (last 20 lines)"; tail -n 20 "$work/router.log"; } >&2
fi
exit "$status"
