#!/usr/bin/env bash
# Files and powers: only the project is visible and writable; no capability, route, address, nftables,
# hosts or resolv.conf change; no podman socket, setuid file or host proxy variable.
# Usage: files.sh SECRET MARKER (a host file outside the project, a file in the host's home).
set -u
# shellcheck source-path=SCRIPTDIR source=helpers.sh
. ./helpers.sh
secret=$1
marker=$2
t project-writable bash -c 'echo x > created-in-sandbox'
f outside-invisible test -e "$secret"
f host-home-invisible test -e "$marker"
# Bind mounts from the host: the project, hosts, resolv.conf and podman's own files (hostname,
# .containerenv, the init binary); the home volume lives under the container storage's volumes.
# Rootless, the scenario's file system below the project comes with the project's recursive bind and is
# covered by an empty tmpfs (both at $PWD/submount); rootful, the project is bound alone.
# shellcheck disable=SC2016 # expanded by the inner bash
t only-expected-host-mounts bash -c '! awk '"'"'{print $5}'"'"' /proc/self/mountinfo | grep -vxE "$PWD|/|/etc/hosts|/etc/resolv.conf|/etc/hostname|/etc/passwd|/etc/group|/run/.containerenv|/run/podman-init|/dev.*|/proc.*|/sys.*|$HOME|$PWD/submount" | grep -q .'
# shellcheck disable=SC2016 # expanded by the inner bash
t home-is-volume bash -c 'touch "$HOME/.as-e2e" && rm "$HOME/.as-e2e"'
f no-address-change ip addr add 10.99.99.99/32 dev lo
f no-route-change ip route add 10.99.0.0/16 dev lo
f no-nftables nft add table inet as_e2e
f hosts-readonly bash -c 'echo "1.2.3.4 web.test" >> /etc/hosts'
f resolv-readonly bash -c 'echo "nameserver 1.1.1.1" >> /etc/resolv.conf'
f forwarder-invisible bash -c 'ps -eo comm | grep -q forwarder'
f no-podman-socket bash -c 'find / -xdev \( -name podman.sock -o -name docker.sock \) 2>/dev/null | grep -q . || ls /run/podman/podman.sock /run/user/*/podman/podman.sock'
f no-setuid-files bash -c 'find / -xdev -perm /6000 -type f 2>/dev/null | grep -q .'
t no-capabilities bash -c 'grep -q "^CapEff:[[:space:]]*0000000000000000" /proc/self/status && grep -q "^CapBnd:[[:space:]]*0000000000000000" /proc/self/status'
f no-host-proxy-variables bash -c 'env | grep -qi "proxy"'
# shellcheck disable=SC2016 # expanded by the inner bash
t ipv6-disabled bash -c 'test "$(cat /proc/sys/net/ipv6/conf/all/disable_ipv6)" = 1'
f submount-invisible test -e submount/marker
