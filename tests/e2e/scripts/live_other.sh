#!/usr/bin/env bash
# The second session of the live scenario (launcher/tests/e2e/scenarios/live.rs): waits for `go`, written
# once `allow blocked.test` has been applied to both sessions, then reaches the newly allowed name.
set -u
# shellcheck source-path=SCRIPTDIR source=helpers.sh
. ./helpers.sh
while [ ! -e go ]; do sleep 0.05; done
out=$(curl -sS --max-time 10 http://blocked.test/)
t other-session-http grep -q "upstream=b proto=http host=blocked.test" <<<"$out"
