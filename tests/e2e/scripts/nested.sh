#!/usr/bin/env bash
# Nested podman in the sandbox: a container from an imported scratch image shares the sandbox's DNS and
# forwarders; one on its own bridge network reaches nothing.
set -u
# shellcheck source-path=SCRIPTDIR source=helpers.sh
. ./helpers.sh
t nested-import podman import --quiet nested.tar localhost/as-e2e-nested:1
out=$(podman run --rm localhost/as-e2e-nested:1 /bin/probe dns web.test 2>&1)
t nested-resolves test "$out" = 127.0.0.2
out=$(podman run --rm localhost/as-e2e-nested:1 /bin/probe get web.test 80 2>&1)
t nested-reaches-allowlisted grep -q "upstream=a proto=http host=web.test" <<<"$out"
out=$(podman run --rm localhost/as-e2e-nested:1 /bin/probe dns blocked.test 2>&1)
t nested-nxdomain grep -q NXDOMAIN <<<"$out"
out=$(timeout 60 podman run --rm --network bridge localhost/as-e2e-nested:1 /bin/probe get web.test 80 2>&1)
f nested-bridge-reaches-nothing grep -q "upstream=" <<<"$out"
podman rmi -f localhost/as-e2e-nested:1 >/dev/null 2>&1
