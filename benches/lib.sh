# shellcheck shell=bash
# Set-up shared by the benches that run an upstream in a network namespace of their own (ab.sh, proxy.sh,
# reload.sh, soak.sh). Sourced, not run. Every function but bench_cleanup only creates; bench_cleanup, the
# callers' EXIT trap, removes what they made.

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
