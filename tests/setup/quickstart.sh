#!/usr/bin/env bash
# `make quickstart-test`: the README's quick start setup on a fresh Debian 12, in a container made from the
# local Debian base (localhost/debian:bookworm, from `make base-image`). tests/setup/in-container.sh does the
# work inside: `make setup` installs what it should and a second run changes nothing, then the same for
# `make setup-test`, then the dnf path with stand-ins for dnf and rpm. apt inside the container downloads
# from the Debian mirror (a package registry); nothing else leaves this machine. Removes its container on
# every way out. Run it as root (rootful podman), under the podman lock like the other image tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/tests/containers.conf}

image=${QUICKSTART_IMAGE:-localhost/debian:bookworm}
if ! podman image exists "$image"; then
    echo "FAIL: no $image here: make base-image makes it" >&2
    exit 1
fi
name=agent-sandbox-quickstart-$$
copy=$(mktemp -d)
trap 'podman rm -f -t 0 "$name" >/dev/null 2>&1 || true; rm -rf "$copy"' EXIT
# What `make setup` needs from the tree, copied (edits during a run cannot reach it) and mounted read-only
# (setup must not write into the tree).
chmod 0755 "$copy"
tar -c Makefile Cargo.toml packaging tests/setup | tar -x -C "$copy"
podman run -d --name "$name" --label agent-sandbox.test=quickstart -v "$copy:/src:ro" -w /src \
    "$image" sleep infinity >/dev/null
podman exec -w /src "$name" bash /src/tests/setup/in-container.sh
