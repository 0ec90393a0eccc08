#!/usr/bin/env bash
# Soak: mixed load against ONE router for SOAK_SECONDS (default 600) with a reload every 10 s and faulty
# upstreams, watching its descriptors and RSS. `make soak`; not part of `make test`.
#
# Load (benches/soak_load.py, open loop): new TLS and new HTTP connections (paced), kept-alive HTTP
# requests, slow clients (head byte by byte), slow readers (a 4 MiB body read 16 KiB every 10 ms, checked
# byte for byte), garbage clients, clients that reset mid-hello, clients that half-close mid-hello, a raw
# host:port relay in use, and requests in turn to four faulty upstreams (refuses: an address with no
# listener; accepts and never answers; resets mid-response; its SYNs black-holed by a firewall rule) and
# to four names the resolver answers badly (SERVFAIL; an empty truncated answer; an answer later than
# the router waits; no answer at all), plus DNS queries from dnsperf at a modest fixed rate. Those are
# issue 17's faults but one: the resolver down altogether, which would fail the allowed load too, is
# router/tests/faults.rs's (`resolver_down`), in `make test`, as is every fault on its own. The upstreams
# live in a network namespace this script creates (198.18.77.0/29 over a veth, no default route in it);
# the router listens on 127.0.7.1, its resolver (benches/soak_load.py resolver) on 127.0.7.2. Root only.
# Traffic stays on this machine.
#
# Pass: every request the policy allows succeeds, each fault gets the answer it must (a 502, a close or a
# truncated response) no sooner than its fault allows (a black hole not before the connect timeout),
# garbage gets a prompt result, no DNS query lost, no reload failed, the router alive throughout and
# exiting 0 on SIGTERM, descriptors and RSS flat after warm-up (the first 30 s row) and descriptors back
# to the idle count once the load stops.
# Prints one row per 30 s (time, fds, RSS KiB, connections/s) and the p99 of new TLS connections.
# Usage: benches/soak.sh [OUT.md]   (SOAK_SECONDS=600 QPS=200 CPS=20 to change the duration and rates)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benches/lib.sh
. benches/lib.sh
secs=${SOAK_SECONDS:-600}
out=${1:-/dev/stdout}
qps=${QPS:-200}
cps=${CPS:-20}
# Slack over the warm-up row before a later row counts as growth: in-flight connections vary.
fd_slack=${FD_SLACK:-64}
rss_slack_kib=${RSS_SLACK_KIB:-8192}
router=${ROUTER_BIN:-target/release/agent-sandbox-router}
[ -x "$router" ] || cargo build --release --locked -p agent-sandbox-router
[ "$(id -u)" = 0 ] || { echo "benches/soak.sh needs root (network namespace)" >&2; exit 1; }
for tool in nginx nft dnsperf curl openssl python3; do
    command -v "$tool" >/dev/null || { echo "missing $tool (make bench installs the tools)" >&2; exit 1; }
done
[ "$secs" -ge 60 ] || { echo "SOAK_SECONDS must be at least 60 (30 s of warm-up, then rows to compare)" >&2; exit 1; }

ns="asb-soak-$$"
veth="asbs$$"
work=$(mktemp -d)
chmod 755 "$work"
pids=()
trap bench_cleanup EXIT
fail() { # message...: print the evidence and exit 1
    {
        echo "soak FAILED: $*"
        echo "--- load"; cat "$work/load.out" "$work/load.err" 2>/dev/null || true
        echo "--- dnsperf"; cat "$work/dnsperf.out" 2>/dev/null || true
        echo "--- curves"; cat "$work/rows" 2>/dev/null || true
        echo "--- router log (last 30 lines)"; tail -n 30 "$work/router.log"
    } >&2
    exit 1
}

# --- the upstream host: .2 nginx (443 TLS, 80 HTTP, 8080 for the host:port entry), .3 nothing listens
# (refuses), .4 accepts and never answers, .5 resets mid-response, .6 drops every SYN ------------------
up=198.18.77
upstream_netns "$ns" "$veth" "$up.1/29" "$up.2/29" "$up.3/29" "$up.4/29" "$up.5/29" "$up.6/29"
ip netns exec "$ns" nft -f - <<NFT
table inet soak {
    chain input {
        type filter hook input priority 0;
        ip daddr $up.6 tcp flags syn drop
    }
}
NFT
upstream_cert "$work"
mkdir -p "$work/www"
echo "hello from upstream" >"$work/www/small"
# The slow readers' body (benches/soak_load.py big_body).
python3 -c 'import sys; sys.stdout.buffer.write(bytes(i % 251 for i in range(4 << 20)))' >"$work/www/big"
cat >"$work/nginx-up.conf" <<EOF
worker_processes 1;
pid $work/nginx-up.pid;
error_log $work/nginx-up.err warn;
events { worker_connections 8192; }
http {
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 3600s;
    server {
        listen $up.2:80 backlog=4096;
        listen $up.2:8080 backlog=4096;
        listen $up.2:443 ssl backlog=4096;
        ssl_certificate $work/cert.pem;
        ssl_certificate_key $work/key.pem;
        root $work/www;
    }
}
EOF
ip netns exec "$ns" nginx -c "$work/nginx-up.conf" -e "$work/nginx-up.err"
ip netns exec "$ns" python3 benches/soak_load.py faults --silent "$up.4" --reset "$up.5" \
    >"$work/faults.out" 2>"$work/faults.err" &
pids+=($!)

# The slow name's answer comes after 15 s, past the router's connect timeout (10 s, its default).
python3 benches/soak_load.py resolver --listen 127.0.7.2 --port 5353 \
    --answer upstream.test="$up.2" --answer refused.test="$up.3" --answer silent.test="$up.4" \
    --answer reset.test="$up.5" --answer blackhole.test="$up.6" --servfail servfail.test \
    --truncated truncated.test --slow slowdns.test --slow-answer upstream.test --slow-seconds 15 \
    --silent silentdns.test >"$work/resolver.out" 2>"$work/resolver.log" &
pids+=($!)

# --- the router ------------------------------------------------------------------------------------
# Each reload rotates one name in and the previous one out, so every reload changes the policy; the
# names the load uses stay allowed throughout.
write_allowlist() { # generation
    printf 'upstream.test\nupstream.test:8080\n.stable.test\nrefused.test\nsilent.test\nreset.test\nblackhole.test\nservfail.test\ntruncated.test\nslowdns.test\nsilentdns.test\ngen-%s.test\n' \
        "$1" >"$work/allowed-hosts.new"
    mv "$work/allowed-hosts.new" "$work/allowed-hosts"
}
write_allowlist 0
admin=127.0.7.1:9901
peek=5
# --idle-timeout 5: the silent upstream's relay is closed by the router within a bound, not by the client.
"$router" --allowlist "$work/allowed-hosts" --log-format json --answer 127.0.7.1 --dns 127.0.7.1:5301 \
    --http 127.0.7.1:80 --https 127.0.7.1:443 --forward upstream.test:8080=127.0.7.1:8080 \
    --resolver 127.0.7.2:5353 --admin "$admin" --peek-timeout "$peek" --idle-timeout 5 \
    --threads "${ROUTER_THREADS:-1}" 2>"$work/router.log" &
router_pid=$!
pids+=("$router_pid")

ready() { curl -sk --max-time 2 --resolve "upstream.test:443:127.0.7.1" https://upstream.test/small >/dev/null; }
for _ in $(seq 100); do
    ready && curl -sf --max-time 1 "http://$admin/readyz" >/dev/null && grep -q ready "$work/faults.out" &&
        grep -q ready "$work/resolver.out" && break
    sleep 0.1
done
ready || { kill "$router_pid"; fail "router not ready"; }
grep -q ready "$work/faults.out" || { kill "$router_pid"; fail "fault upstreams not ready: $(cat "$work/faults.err")"; }

metric_sum() { # name -> sum over its label sets
    curl -sf --max-time 2 "http://$admin/metrics" |
        awk -v n="agent_sandbox_router_$1" 'index($1, n "{") == 1 || $1 == n {s += $2} END {print s + 0}'
}
reloads() { router_reloads "$admin" "$1"; }
fds() { find "/proc/$router_pid/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }
rss() { awk '/^VmRSS:/ {print $2}' "/proc/$router_pid/status"; }
alive() { kill -0 "$router_pid" 2>/dev/null || fail "the router exited during the run"; }

idle_fds=$(fds)
ok_before=$(reloads success)
failed_before=$(reloads failure)

dns_queries "$work/queries"
dnsperf -s 127.0.7.1 -p 5301 -d "$work/queries" -l "$secs" -Q "$qps" -c 2 -q 100 -t 5 \
    >"$work/dnsperf.out" 2>&1 &
dns_pid=$!
pids+=("$dns_pid")
python3 benches/soak_load.py load --ip 127.0.7.1 --name upstream.test --http-port 80 --relay-port 8080 \
    --fault-names refused.test,silent.test,reset.test,blackhole.test,servfail.test,truncated.test,slowdns.test,silentdns.test \
    --rate "$cps" --peek-timeout "$peek" --connect-timeout 10 --idle-timeout 5 --seconds "$secs" \
    >"$work/load.out" 2>"$work/load.err" &
load_pid=$!
pids+=("$load_pid")

# One tick a second: a reload every 10 s, a row every 30 s.
echo "| time, s | fds | RSS, KiB | connections/s |" >"$work/rows"
echo "|---:|---:|---:|---:|" >>"$work/rows"
conns_prev=$(metric_sum connections_total)
declare -a row_fds row_rss
sighups=0
start=$(date +%s)
for t in $(seq 1 "$secs"); do
    # Sleep to the tick's wall-clock time, so the work of a tick does not stretch the run.
    now=$(date +%s)
    [ $((start + t)) -le "$now" ] || sleep $((start + t - now))
    alive
    if [ $((t % 10)) = 0 ]; then
        write_allowlist "$t"
        kill -HUP "$router_pid" 2>/dev/null || fail "the router exited during the run"
        sighups=$((sighups + 1))
    fi
    if [ $((t % 30)) = 0 ]; then
        f=$(fds)
        r=$(rss)
        c=$(metric_sum connections_total)
        echo "| $t | $f | $r | $(((c - conns_prev) / 30)) |" >>"$work/rows"
        conns_prev=$c
        row_fds+=("$f")
        row_rss+=("$r")
    fi
done
load_status=0
wait "$load_pid" || load_status=$?
dns_status=0
wait "$dns_pid" || dns_status=$?
alive
# The signal and the file watch may both reload for one rewrite; let a last one settle.
sleep 2
ok=$(($(reloads success) - ok_before))
failed=$(($(reloads failure) - failed_before))

# With the load gone every connection must close: descriptors back to the idle count (within 2 s of
# the idle timeout, the longest any relay may linger).
settled=""
for _ in $(seq 80); do
    f=$(fds)
    [ "$f" -le "$idle_fds" ] && { settled=$f; break; }
    sleep 0.1
done
final_fds=$(fds)
final_rss=$(rss)

kill -TERM "$router_pid"
router_status=0
wait "$router_pid" || router_status=$?

field() { dnsperf_field "$work/dnsperf.out" "$1"; }
sent=$(field '  Queries sent:')
completed=$(field '  Queries completed:')
lost=$(field '  Queries lost:')
# soak_load.py prints one line per kind: kind=... key=value pairs.
kv() { awk -v k="kind=$1" -v f="$2=" '$1 == k {for (i = 2; i <= NF; i++) if (index($i, f) == 1) print substr($i, length(f) + 1)}' "$work/load.out"; }

problems=()
[ "$load_status" = 0 ] || problems+=("a client kind failed (status $load_status): $(grep -v 'failed=0 ' "$work/load.out" | tr '\n' ';')")
[ "$dns_status" = 0 ] && [ -n "$sent" ] || problems+=("dnsperf failed (status $dns_status)")
[ "${lost:-1}" = 0 ] || problems+=("${lost:-?} DNS queries lost")
[ "$failed" = 0 ] || problems+=("$failed reloads failed")
[ "$ok" -ge "$sighups" ] || problems+=("only $ok successful reloads for $sighups SIGHUPs")
[ -n "$settled" ] || problems+=("descriptors did not fall back to the idle $idle_fds once the load stopped: $final_fds")
[ "$router_status" = 0 ] || problems+=("the router exited $router_status on SIGTERM")
grep -qi panick "$work/router.log" && problems+=("the router logged a panic")
for i in "${!row_fds[@]}"; do
    [ "$i" = 0 ] && continue
    [ "${row_fds[$i]}" -le $((row_fds[0] + fd_slack)) ] ||
        problems+=("descriptors grew after warm-up: ${row_fds[0]} at 30 s, ${row_fds[$i]} at $(((i + 1) * 30)) s")
    [ "${row_rss[$i]}" -le $((row_rss[0] + rss_slack_kib)) ] ||
        problems+=("RSS grew after warm-up: ${row_rss[0]} KiB at 30 s, ${row_rss[$i]} KiB at $(((i + 1) * 30)) s")
done

{
    echo "Soak of $secs s: one router (\`--threads ${ROUTER_THREADS:-1} --peek-timeout $peek --idle-timeout 5\`), reload every 10 s."
    echo
    cat "$work/rows"
    echo
    echo "| load | succeeded / failed | p50 / p99 / max, ms | what came back |"
    echo "|---|---:|---:|---|"
    for k in tls http keepalive slow slow-reader relay garbage reset-hello half-close fault-refused fault-silent \
        fault-reset fault-blackhole fault-servfail fault-truncated fault-slowdns fault-silentdns; do
        echo "| $k | $(kv "$k" ok) / $(kv "$k" failed) | $(kv "$k" p50_ms) / $(kv "$k" p99_ms) / $(kv "$k" max_ms) | $(kv "$k" outcomes) |"
    done
    echo "| DNS (dnsperf -Q $qps): sent / answered / lost | $sent / $completed / $lost | | |"
    echo
    echo "New TLS connections ($cps/s): p99 $(kv tls p99_ms) ms. Reloads: $sighups SIGHUPs, $ok succeeded, $failed failed."
    echo "Descriptors idle before the load $idle_fds, after it $final_fds; RSS at the end $final_rss KiB."
    echo "Router exit status on SIGTERM: $router_status."
} >"$work/report"
if [ "${#problems[@]}" != 0 ]; then
    cat "$work/report" >&2
    fail "$(IFS=';'; echo "${problems[*]}")"
fi
if [ "$out" = /dev/stdout ]; then cat "$work/report"; else cp "$work/report" "$out" && cat "$out"; fi
echo "soak: ok"
