#!/usr/bin/env bash
# One of two concurrent sessions: publishes its router's address, waits for the other session's, then
# checks that an allowlisted name works and the other session's router is out of reach (sessions are on
# separate internal networks).
set -u
# shellcheck source-path=SCRIPTDIR source=helpers.sh
. ./helpers.sh
router=$(awk '/^nameserver/{print $2; exit}' /etc/resolv.conf)
echo "$router" > router.tmp && mv router.tmp router
while [ ! -e go ]; do sleep 0.2; done
other=$(cat other)
curl -sS --max-time 10 http://web.test/
f other-router-dns dig +time=2 +tries=1 "@$other" web.test A
f other-router-http timeout 4 bash -c "exec 3<>/dev/tcp/$other/80"
