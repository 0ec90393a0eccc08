#!/usr/bin/env bash
# `make bench`: the whole benchmark suite in one run on this machine, added to the top of BENCHMARKS.md
# (benches/merge-report.sh keeps every earlier section below it).
#
# Installs what it needs from Debian (dnsperf, dnsmasq, nginx with the stream module, wrk, socat, curl,
# hyperfine), builds the release binaries, then runs, one after another so they do not compete:
#   benches/dns.sh        router DNS vs dnsmasq (queries/s, lost queries, RSS)
#   benches/proxy.sh      router vs nginx vs direct (HTTPS/HTTP rates, bulk over HTTP and HTTPS, the
#                         proxy's CPU and its kernel share per new connection and per GiB, the whole
#                         machine's CPU per new connection, RSS idle and with 1,000 conns); socat as a
#                         plain relay in the bulk rows
#   benches/reload.sh     reload every second under 10k DNS q/s and 100 new TLS connections/s (30 s)
#   benches/rss.sh        router RSS with 10,000 idle connections from 100 client addresses
#   forwarder bench       forwarder vs socat (connections/s, bulk)
#   image size            the router image
#   session start         `agent-sandbox --exec true` vs a bare `podman run --rm IMAGE true`
# Root only (network namespaces). All traffic stays on this machine. Usage: benches/run.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/tests/containers.conf}

need=()
for pair in dnsperf:dnsperf dnsmasq:dnsmasq-base nginx:nginx-light wrk:wrk socat:socat curl:curl \
    hyperfine:hyperfine dig:dnsutils nft:nftables; do
    command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
done
[ -f /usr/lib/nginx/modules/ngx_stream_module.so ] || need+=(libnginx-mod-stream)
if [ "${#need[@]}" -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    # The Debian package starts a system nginx; the benchmark runs its own.
    systemctl disable --now nginx >/dev/null 2>&1 || true
fi

cargo build --release --locked -p agent-sandbox-router -p agent-sandbox -p agent-sandbox-forwarder
results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT

echo "== DNS" >&2
benches/dns.sh "$secs" >"$results/dns.txt"
echo "== proxy" >&2
benches/proxy.sh "$secs" "$results/proxy.md" >/dev/null
# The reload and RSS benches fail loudly (lost queries, refused connections, connections not held); the
# suite goes on and the failure is written into BENCHMARKS.md where the figures would be.
echo "== reload under load" >&2
benches/reload.sh "${RELOAD_SECS:-30}" "$results/reload.md" >/dev/null 2>"$results/reload.err" ||
    { echo; echo '```'; tail -n 40 "$results/reload.err"; echo '```'; } >>"$results/reload.md"
echo "== RSS with 10,000 idle connections" >&2
benches/rss.sh "$results/rss.md" >/dev/null 2>"$results/rss.err" ||
    { echo; echo '```'; tail -n 40 "$results/rss.err"; echo '```'; } >>"$results/rss.md"
echo "== forwarder" >&2
make --no-print-directory bench-forwarder >"$results/forwarder.txt" 2>&1 || echo "(forwarder bench failed)" >>"$results/forwarder.txt"

image=${ROUTER_IMAGE:-localhost/agent-sandbox-router:dev}
sandbox_image=${SANDBOX_IMAGE:-localhost/agent-sandbox:dev}
image_size="not built (make build)"
if podman image exists "$image"; then
    bytes=$(podman image inspect "$image" --format '{{.Size}}')
    image_size="$(awk -v b="$bytes" 'BEGIN {printf "%.1f MB (%d bytes)", b / 1e6, b}')"
fi

start="not measured (needs both images: make build)"
if podman image exists "$image" && podman image exists "$sandbox_image"; then
    echo "== session start" >&2
    repo=$PWD
    project=$(mktemp -d /tmp/asb-bench-project.XXXXXX)
    home=$(mktemp -d /tmp/asb-bench-home.XXXXXX)
    printf 'example.test\n' >"$home/allowed-hosts"
    if (cd "$project" && HOME=$home AGENT_SANDBOX_ALLOWLIST=$home/allowed-hosts \
        hyperfine --warmup 1 --runs 5 --export-markdown "$results/start.md" \
            -n 'agent-sandbox --exec true' "$repo/target/release/agent-sandbox --exec true" \
            -n 'podman run --rm IMAGE true' "podman run --rm $sandbox_image true" >/dev/null 2>&1); then
        start=$(cat "$results/start.md")
    fi
    rm -rf "$project" "$home"
fi

cpu=$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)
{
    echo "## $(date -u '+%Y-%m-%d %H:%M UTC'): the full \`make bench\` run"
    echo
    echo "$(nproc) cores ($cpu), $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -sr),"
    echo "$(awk -F= '/^PRETTY_NAME=/ {gsub(/"/, "", $2); print $2}' /etc/os-release). Everything ran on this one machine in one"
    echo "run, one bench after another."
    echo
    echo "### DNS: router vs dnsmasq (dnsperf, ${secs} s each, half allowed names, half refused)"
    echo
    echo "The router with one worker (as in a session) and with its default (one per core, the gateway), and"
    echo "dnsmasq answering from \`--address\` (no cache, no upstream, no query log), in rotating order."
    echo "dnsperf's own receive buffer is raised (\`-b 4096\`) so that a burst of replies is not dropped at the"
    echo "load generator and counted against the server."
    echo
    cat "$results/dns.txt"
    echo
    echo "### TLS and HTTP: router vs nginx vs direct"
    echo
    echo "Upstream: nginx in a network namespace over a veth pair. nginx as the proxy: stream"
    echo "\`ssl_preread\` on 443 and Host-routing \`proxy_pass http://\$host\` on 80, both dialling the name the"
    echo "client sent through a resolver (the design agent-sandbox replaces), at its best honest configuration"
    echo "(printed below the tables: a worker per core with a reuseport listener each, buffered access logs like"
    echo "the router's connection log, HTTP/1.0 to the upstream so the upstream closes first, bulk through 16 x"
    echo "64 KiB in-memory buffers), plus dnsmasq for the sandbox's DNS (counted in its RSS). Each contender"
    echo "reaches the upstream on its own address, so TIME_WAIT sockets of one run cannot slow the next. The"
    echo "router runs twice: with one worker (\`--threads 1\`, as in a session) and with its default (one per"
    echo "core, as a gateway)."
    echo
    cat "$results/proxy.md"
    echo
    echo "### Reload under load (benches/reload.sh)"
    echo
    echo "One router (gateway defaults: one worker per core) answers dnsperf at a fixed 10,000 queries/s"
    echo "(\`-Q 10000\`; allowed, wildcard, rotating and refused names) and takes 100 new TLS connections/s"
    echo "to an always-allowed name from an open-loop paced client (benches/paced_tls.py: a new connection"
    echo "every 10 ms whether or not earlier ones finished; handshake, one GET, close) for ${RELOAD_SECS:-30} s, while a"
    echo "loop renames a new allowlist into place and sends SIGHUP every second (the file watch may add"
    echo "reloads of its own). Passes only with 0 queries lost, 0 failed connections and 0 failed reloads."
    echo
    cat "$results/reload.md"
    echo
    echo "### RSS with 10,000 idle connections (benches/rss.sh)"
    echo
    echo "The router in a network namespace, clients on 100 addresses (198.18.1.1-100) of another, over a"
    echo "veth pair; each client opens its share round-robin and then sends nothing more."
    echo
    cat "$results/rss.md"
    echo
    echo "### Forwarder vs socat (\`socat TCP-LISTEN:…,fork,reuseaddr TCP:…\`)"
    echo
    echo '```'
    # The measurements only (from the bench's own header on); the whole log if it never got that far.
    if grep -q '^relay benchmark' "$results/forwarder.txt"; then
        sed -n '/^relay benchmark/,$p' "$results/forwarder.txt"
    else
        tail -n 30 "$results/forwarder.txt"
    fi
    echo '```'
    echo
    echo "### Images and start-up"
    echo
    echo "- Router image ($image): $image_size"
    echo
    echo "$start"
} >"$results/report.md"
benches/merge-report.sh "$results/report.md" BENCHMARKS.md
echo "wrote BENCHMARKS.md (this run on top, the earlier sections kept below)" >&2
