#!/usr/bin/env bash
# Builds the router image from static release builds of agent-sandbox-router and agent-sandbox-forwarder.
#
#   containers/router/build.sh [IMAGE]            (default localhost/agent-sandbox-router:dev)
#   containers/router/build.sh --binaries-only    the static binaries only, under
#                                                 target/x86_64-unknown-linux-gnu/{release,release-small}/
#
# The one place that knows how the image is made: `make router-image` calls it, and the launcher's
# `--build-images` can take it over later. The binaries are static (-C target-feature=+crt-static, with an
# explicit --target so that build scripts and proc macros stay dynamic) because the image is FROM scratch.
# The forwarder uses the release-small profile to stay under its 1.5 MB budget.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
binaries_only=false
if [ "${1:-}" = --binaries-only ]; then
    binaries_only=true
    shift
fi
image=${1:-localhost/agent-sandbox-router:dev}
target=x86_64-unknown-linux-gnu
cargo=${CARGO:-cargo}
target_dir=${CARGO_TARGET_DIR:-$root/target}
# Only the two binaries go to podman: the build context must not be the whole (multi-GB) target dir.
context=$target_dir/router-image

cd "$root"
export RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static"
"$cargo" build --locked --target "$target" --release -p agent-sandbox-router
"$cargo" build --locked --target "$target" --profile release-small -p agent-sandbox-forwarder
if $binaries_only; then
    exit 0
fi

rm -rf "$context"
mkdir -p "$context"
cp "$target_dir/$target/release/agent-sandbox-router" \
   "$target_dir/$target/release-small/agent-sandbox-forwarder" "$context/"
podman build --quiet --file containers/router/Containerfile --tag "$image" "$context" >/dev/null
echo "built $image"
