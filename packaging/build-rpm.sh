#!/usr/bin/env bash
# Builds dist/agent-sandbox-VERSION-RELEASE.x86_64.rpm (`make rpm`).
#
# The packaged launcher pins the images the release pipeline publishes for this version; the in-repo
# build keeps the local :dev images. It is built in its own target directory so the pinned names never
# leak into development builds.
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(packaging/version.sh)
spec_version=$(awk '/^Version:/ {print $2}' packaging/agent-sandbox.spec)
if [ "$version" != "$spec_version" ]; then
    echo "packaging/agent-sandbox.spec has Version $spec_version but Cargo.toml has $version (use make patch|minor|major)" >&2
    exit 1
fi
registry=${REGISTRY:-artifactapi.k8s.syd1.au.unkin.net/docker-internal}
export AGENT_SANDBOX_DEFAULT_IMAGE="$registry/agent-sandbox:$version"
export AGENT_SANDBOX_DEFAULT_ROUTER_IMAGE="$registry/agent-sandbox-router:$version"

target=$PWD/target/rpm
stage=$target/stage
rm -rf "$stage" "$target/rpmbuild"
mkdir -p "$stage" dist
cargo build --release --locked -p agent-sandbox --target-dir "$target"
cp "$target/release/agent-sandbox" "$stage/"
cargo run --quiet --locked -p agent-sandbox-docgen --target-dir "$target" -- "$stage" >/dev/null
cp packaging/allowed-hosts README.md LICENSE "$stage/"

rpmbuild -bb --quiet \
    --define "_topdir $target/rpmbuild" \
    --define "_sourcedir $stage" \
    --define "_rpmdir $PWD/dist" \
    --define "_build_name_fmt %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm" \
    packaging/agent-sandbox.spec
release=$(awk '/^Release:/ {print $2}' packaging/agent-sandbox.spec)
echo "dist/agent-sandbox-$version-$release.x86_64.rpm"
