#!/usr/bin/env bash
# Escape attempts: every address in `targets` (written by the suite once the session exists) must be
# unreachable, and the sandbox has no route but its own.
set -u
# shellcheck source-path=SCRIPTDIR source=helpers.sh
. ./helpers.sh
touch ready
for _ in $(seq 600); do [ -e targets ] && break; sleep 0.2; done
router=$(awk '/^nameserver/{print $2; exit}' /etc/resolv.conf)
t router-dns-works bash -c "dig +time=3 +tries=1 @$router web.test A | grep -q 127.0.0.2"
while read -r kind ip port; do
  case $kind in
    dns-server) f "dns-$ip" dig +time=2 +tries=1 "@$ip" web.test A ;;
    udp) echo probe > "/dev/udp/$ip/$port"; echo "ok udp-$ip-sent" ;;
    host6) f "tcp6-$ip" curl -g -sS --max-time 3 "http://[$ip]:$port/" ;;
    *) f "tcp-$kind-$ip" timeout 4 bash -c "exec 3<>/dev/tcp/$ip/$port" ;;
  esac
done < targets
f no-ipv6-route bash -c 'ip -6 route show | grep -v "^::1 \|^fe80\|^local\|^multicast" | grep -q .'
t ipv6-loopback-only bash -c '! ip -6 addr show scope global | grep -q inet6'
f no-default-route bash -c 'ip route show | grep -q "^default"'
