# shellcheck shell=bash
# Set-up and measuring helpers shared by the benches that run an upstream in a network namespace of their
# own (ab.sh, floor.sh, proxy.sh, reload.sh, soak.sh). Sourced, not run. bench_cleanup, the callers' EXIT
# trap, removes what the set-up functions made; the rest only create, or only read.
#
# Every bench runs the router with `--log-format json`, as the launcher and the Kubernetes deployment
# do: each connection writes a log line, and the two formats do not cost the same (BENCHMARKS.md).

# bench_cleanup: kills the caller's background processes ($pids) and every nginx whose pid file is in
# $work, removes the veth pair $veth and the namespace $ns, then $work. Each step tolerates what is not
# there (the trap may fire before everything was made).
# shellcheck disable=SC2154 # the caller's variables
bench_cleanup() {
    local p f
    # Children first (socat's relay children), by parent pid: only what these processes started.
    for p in "${pids[@]}"; do pkill -P "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
    for f in "$work"/nginx-*.pid; do
        if [ -f "$f" ]; then kill "$(cat "$f")" 2>/dev/null || true; fi
    done
    ip link del "$veth" 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "$work"
}

# upstream_netns NS VETH HOST_CIDR NS_CIDR...: a network namespace NS joined to this host by the veth pair
# VETH (host side, address HOST_CIDR) / eth0 (NS side, every NS_CIDR). No default route inside: the
# upstreams in it can reach nothing but this host.
upstream_netns() {
    local ns=$1 veth=$2 host=$3 a
    shift 3
    ip netns add "$ns"
    ip link add "$veth" type veth peer name eth0 netns "$ns"
    ip addr add "$host" dev "$veth"
    ip link set "$veth" up
    for a in "$@"; do ip -n "$ns" addr add "$a" dev eth0; done
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
}

# upstream_cert DIR: DIR/key.pem and DIR/cert.pem for upstream.test. ECDSA, so the upstream's handshake
# cost stays small next to the router's.
upstream_cert() {
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=upstream.test \
        -addext subjectAltName=DNS:upstream.test -keyout "$1/key.pem" -out "$1/cert.pem" 2>/dev/null
}

# router_reloads ADMIN RESULT: the router's config_reloads_total{result=RESULT} from its /metrics.
router_reloads() {
    curl -sf --max-time 2 "http://$1/metrics" |
        awk -v r="$2" '$1 == "agent_sandbox_router_config_reloads_total{result=\"" r "\"}" {print $2; f=1} END {if (!f) print 0}'
}

# dnsperf_field FILE KEY: the first word after KEY (e.g. '  Queries lost:') in dnsperf's output FILE.
dnsperf_field() {
    awk -v k="$2" 'index($0, k) == 1 {sub(k, ""); print $1; exit}' "$1"
}

# dns_queries FILE: a dnsperf query file of always-allowed, stable-wildcard, rotating (answered or not by
# the allowlist generation in force) and never-allowed names, so every query must get an answer whichever
# policy is in force when it lands.
dns_queries() {
    local i
    for i in $(seq 1 250); do
        echo "upstream.test A"
        echo "host$i.stable.test A"
        echo "gen-$i.test A"
        echo "x$i.exfil.test A"
    done >"$1"
}

# upstream_nginx NS DIR: the benches' upstream, an nginx with one worker in namespace NS serving DIR/www on
# 80 and on 443 (DIR/cert.pem, DIR/key.pem), no access log, sendfile, unlimited kept-alive requests. Its
# pid file is DIR/nginx-up.pid (the caller's EXIT trap stops it).
upstream_nginx() {
    local ns=$1 dir=$2
    cat >"$dir/nginx-up.conf" <<EOF
worker_processes 1;
pid $dir/nginx-up.pid;
error_log $dir/nginx-up.err warn;
events { worker_connections 8192; }
http {
    access_log off;
    sendfile on;
    keepalive_requests 1000000;
    server {
        listen 80 backlog=4096;
        listen 443 ssl backlog=4096;
        ssl_certificate $dir/cert.pem;
        ssl_certificate_key $dir/key.pem;
        root $dir/www;
    }
}
EOF
    ip netns exec "$ns" nginx -c "$dir/nginx-up.conf" -e "$dir/nginx-up.err"
}

# proxy_nginx_conf DIR LISTEN_IP RESOLVER: writes DIR/nginx-px.conf, the benches' nginx proxy on LISTEN_IP
# (443 and 80), resolving names through RESOLVER (ADDR:PORT); its logs and pid file go in DIR.
# nginx at its best honest configuration for this job (written out in BENCHMARKS.md): the design the
# router replaces (stream ssl_preread on 443, proxy_pass http://$host with a resolver on 80), one worker per
# core, a reuseport listener per worker, buffered access logs (nginx never fsyncs them; the router logs
# every connection too), resolver answers cached for dnsmasq's TTL. To the upstream it speaks nginx's
# default HTTP/1.0 with Connection: close, so the upstream closes first and its TIME_WAIT stays there, as
# the router's does; keeping HTTP/1.1 without an upstream keepalive pool would leave every closed upstream
# socket in TIME_WAIT on nginx's side and run it out of ports (2.2k connections/s in an earlier version of
# this script). Bulk relays through 64 KiB buffers held in memory (no temp files).
proxy_nginx_conf() {
    local dir=$1 listen=$2 resolver=$3
    cat >"$dir/nginx-px.conf" <<EOF
worker_processes auto;
worker_rlimit_nofile 20000;
pid $dir/nginx-px.pid;
error_log $dir/nginx-px.err warn;
load_module /usr/lib/nginx/modules/ngx_stream_module.so;
events { worker_connections 8192; }
stream {
    log_format conn '\$remote_addr [\$time_local] \$ssl_preread_server_name \$upstream_addr \$status \$bytes_sent \$bytes_received \$session_time';
    access_log $dir/nginx-px-stream.log conn buffer=64k flush=1s;
    # As in the design agent-sandbox replaces: the allowlisted name the client sent is resolved and
    # dialled (dnsmasq answers the names), everything else goes nowhere.
    resolver $resolver ipv6=off;
    map \$ssl_preread_server_name \$allowed {
        upstream.test \$ssl_preread_server_name:443;
        default 127.0.0.1:9;
    }
    server {
        listen $listen:443 backlog=4096 reuseport;
        ssl_preread on;
        proxy_pass \$allowed;
    }
}
http {
    access_log $dir/nginx-px-http.log combined buffer=64k flush=1s;
    resolver $resolver ipv6=off;
    server {
        listen $listen:80 backlog=4096 reuseport;
        server_name upstream.test;
        location / {
            proxy_pass http://\$host;
            # The fastest and cheapest of the buffer settings tried for the bulk row (1 GiB, 3 runs
            # each): buffered in memory through 16 x 64 KiB, never to a temp file: ~780 MiB/s at ~550
            # ms CPU per GiB, against ~530 MiB/s and ~1.1 s for the defaults, buffered or not.
            proxy_buffering on;
            proxy_max_temp_file_size 0;
            proxy_buffer_size 64k;
            proxy_buffers 16 64k;
            proxy_busy_buffers_size 128k;
        }
    }
    server { listen $listen:80 default_server; return 403; }
}
EOF
}

# wrk_at IP URL [WRK ARGS...]: wrk with upstream.test at IP and --latency; uses the caller's $work.
# wrk resolves names with getaddrinfo and has no --resolve: give it a private /etc/hosts.
wrk_at() { # ip url [wrk args...]
    local ip=$1 url=$2
    shift 2
    printf '%s upstream.test\n' "$ip" >"$work/hosts.$ip"
    # shellcheck disable=SC2016 # expanded by the inner shell
    unshare --mount sh -c 'mount --bind "$1" /etc/hosts && shift && exec wrk "$@"' sh "$work/hosts.$ip" \
        "$@" --latency "$url"
}

# stat_ticks "FIELD..." PID...: the sum over the given pids of the given /proc/PID/stat fields, in clock
# ticks (14 utime, 15 stime, 16 cutime, 17 cstime); a pid gone counts 0.
stat_ticks() {
    local fields=$1 total=0 p
    shift
    for p in "$@"; do
        total=$((total + $(awk -v f="$fields" '{n = split(f, a, " "); t = 0; for (i = 1; i <= n; i++) t += $a[i]; print t}' \
            "/proc/$p/stat" 2>/dev/null || echo 0)))
    done
    echo "$total"
}
cpu_ticks() { stat_ticks "14 15" "$@"; } # user + system
sys_ticks() { stat_ticks "15" "$@"; }    # system: the kernel's share of cpu_ticks
# Every process's CPU on the machine (user, nice, system, irq, softirq; not idle, iowait or steal), in
# clock ticks: what one new connection costs the whole chain (load generator, proxy, upstream, kernel).
machine_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
# busy_cores T0 T1 SECONDS: how many cores machine_ticks says were busy on average over a run. At the
# number of cores the machine was saturated, and its CPU per connection is only the inverse of the rate.
busy_cores() { awk -v t="$(($2 - $1))" -v hz="$(getconf CLK_TCK)" -v s="$3" 'BEGIN {printf "%.2f", t / hz / s}'; }

# median: the median of the numbers on stdin, one per line ("-" if none). With an even count, the mean of
# the middle two, to two decimals if they have decimals (cores busy), else rounded (rates, µs).
median() {
    sort -n | awk '{v[NR] = $1} END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2];
        else { a = v[NR / 2]; b = v[NR / 2 + 1]; printf (index(a b, ".") ? "%.2f" : "%.0f"), (a + b) / 2 } }'
}
# ratio A B: A / B to two decimals, "n/a" if either is missing or B is 0.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a != "-" && b > 0) printf "%.2f", a / b; else print "n/a" }'; }

# rps: requests/s from wrk's output on stdin, rounded; the whole output is appended to $work/wrk.all, so
# the errors wrk reports can be summed in the report (wrk_errors).
rps() { tee -a "$work/wrk.all" | awk '/^Requests\/sec:/ {printf "%.0f", $2}'; }
# no_rate RATE WHO KEY: stops the run if wrk gave no rate (its last output in $work/wrk.all shown): a
# missing sample would leave that contender with fewer rounds than the others and shift the pairing of
# rounds in the report (paired).
no_rate() {
    if [ -z "$1" ] || [ "$1" = 0 ]; then
        { echo "wrk gave no rate ($2, $3):"; tail -20 "$work/wrk.all"; } >&2
        exit 1
    fi
}
# wrk_errors FILE: wrk's error counts summed over every run whose output is in FILE.
wrk_errors() {
    awk '/Non-2xx/ {n += $NF} /Socket errors/ {gsub(",", ""); c += $4; r += $6; w += $8; t += $10}
        END {printf "%d non-2xx; connect %d, read %d, write %d, timeout %d", n, c, r, w, t}' "$1"
}
# summarise: fills the caller's associative arrays result and spread with the median and the
# lowest–highest range of each key of its samples array (one sample per word).
# shellcheck disable=SC2004 # result and spread are the caller's associative arrays (declare -A)
summarise() {
    local key
    for key in "${!samples[@]}"; do
        # shellcheck disable=SC2086 # one sample per word
        result[$key]=$(printf '%s\n' ${samples[$key]} | median)
        # shellcheck disable=SC2086
        spread[$key]=$(printf '%s\n' ${samples[$key]} | sort -n | awk 'NR == 1 {lo = $1} {hi = $1} END {print lo "–" hi}')
    done
}
# paired WHO BASE MEASURE: the median of the per-round ratios WHO/BASE of the caller's samples, with the
# lowest and highest ("n/a" if either is missing). Both ran in the same rounds, so this is steadier than
# the ratio of the medians when whole rounds are faster or slower. Sample lists of different lengths
# cannot be paired round by round: "n/a (unpaired)".
paired() {
    local -a a b
    local i
    read -r -a a <<<"${samples[$1,$3]:-}"
    read -r -a b <<<"${samples[$2,$3]:-}"
    if [ "${#a[@]}" -eq 0 ] || [ "${#b[@]}" -eq 0 ]; then
        echo "n/a"
        return
    fi
    if [ "${#a[@]}" -ne "${#b[@]}" ]; then
        echo "n/a (unpaired)"
        return
    fi
    for i in "${!a[@]}"; do echo "${a[$i]} ${b[$i]}"; done |
        awk '$2 > 0 {printf "%.4f\n", $1 / $2}' | sort -n |
        awk '{v[NR] = $1} END { if (NR == 0) { print "n/a"; exit }
            m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
            printf "%.2f (%.2f–%.2f)", m, v[1], v[NR] }'
}
# cell KEY: "median (lowest–highest)" of KEY after summarise.
cell() { echo "${result[$1]:--} (${spread[$1]:--})"; }
# machine_desc: the machine for a report's first line.
machine_desc() { echo "$(nproc) cores ($(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)), Linux $(uname -r)"; }
# refuse_if_listening PREFIX: stops the script if anything listens, over TCP or UDP, on an address
# starting with PREFIX (say "127.0.6."): left from an aborted run, it would share or take the addresses.
refuse_if_listening() {
    local found
    found=$(ss -Hltunp | awk -v p="$1" 'index($5, p) == 1')
    if [ -n "$found" ]; then
        echo "something already listens on ${1}x (left from an aborted run?):" >&2
        echo "$found" >&2
        exit 1
    fi
}
