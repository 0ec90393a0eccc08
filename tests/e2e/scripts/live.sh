#!/usr/bin/env bash
# Live allowlist changes (launcher/tests/e2e/scenarios/live.rs): while this runs, the suite changes the
# allowlist from the host with `agent-sandbox allow/deny`. Each phase waits for the suite's `phase-N`
# file in the project, checks what the change should have done, then writes `done-N`.
set -u
# shellcheck source-path=SCRIPTDIR source=helpers.sh
. ./helpers.sh
ip_of() { getent ahostsv4 "$1" | awk 'NR==1{print $1}'; }
wait_phase() { while [ ! -e "phase-$1" ]; do sleep 0.05; done; }
phase_done() { : > "done-$1"; }
nx() { dig +time=3 +tries=1 "$1" A | grep -q "status: NXDOMAIN"; }

# 1: nothing changed yet; the suite's `blocked --follow` must print these refusals within a second.
wait_phase 1
date +%s.%N > refused-at
t before-nxdomain nx blocked.test
dig +time=2 +tries=1 $'\e[31mevil\a\e[0m.test' A >/dev/null 2>&1
phase_done 1

# 2: `allow blocked.test`.
wait_phase 2
t plain-resolves test "$(ip_of blocked.test)" = 127.0.0.2
out=$(curl -sS --max-time 10 http://blocked.test/)
t plain-http grep -q "upstream=b proto=http host=blocked.test" <<<"$out"
phase_done 2

# 3: `allow blocked.test:5432`: a new port host gets the next free address; db.test keeps its own.
wait_phase 3
t port-new-address test "$(ip_of blocked.test)" = 127.0.0.4
t port-old-address-kept test "$(ip_of db.test)" = 127.0.0.3
out=$(timeout 10 bash -c 'exec 3<>/dev/tcp/blocked.test/5432; echo hello >&3; cat <&3')
t port-tcp grep -q "upstream=b proto=tcp" <<<"$out"
out=$(curl -sS --max-time 10 http://blocked.test/)
t port-host-http grep -q "upstream=b proto=http host=blocked.test" <<<"$out"
phase_done 3

# 4: `deny blocked.test blocked.test:5432`: NXDOMAIN, and connections through the old addresses refused.
wait_phase 4
t deny-nxdomain nx blocked.test
f deny-http-refused curl -fsS --max-time 5 --resolve blocked.test:80:127.0.0.2 http://blocked.test/
# shellcheck disable=SC2016 # expanded by the inner bash
f deny-port-refused timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.4/5432; echo hello >&3; cat <&3 | grep -q upstream'
phase_done 4

# 5: `allow --session ID .blocked.test`: the wildcard, for this session only.
wait_phase 5
# The apex had its own address in phase 3 (127.0.0.4): allowed again, it keeps it, so an answer
# cached then stays good; a name below it gets the shared one.
t wildcard-apex test "$(ip_of blocked.test)" = 127.0.0.4
t wildcard-sub test "$(ip_of x.blocked.test)" = 127.0.0.2
out=$(curl -sS --max-time 10 http://blocked.test/)
t wildcard-http grep -q "upstream=b proto=http host=blocked.test" <<<"$out"
phase_done 5
