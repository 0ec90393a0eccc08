#!/usr/bin/env bash
# Packaging tests (part of `make test`): builds the RPM, checks its contents, requirements and version,
# installs it into a scratch root and runs the installed launcher from there; then bumps a version in a
# temporary clone and checks the commit, the tag and the files. Creates only temporary directories.
set -euo pipefail
cd "$(dirname "$0")/.."

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
passed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }

version=$(packaging/version.sh)
rpm_path=$(packaging/build-rpm.sh | tail -n 1)
[ -f "$rpm_path" ] || fail "make rpm did not produce $rpm_path"
[ "$rpm_path" = "dist/agent-sandbox-$version-1.x86_64.rpm" ] || fail "unexpected file name $rpm_path"
ok "built $rpm_path"

[ "$(rpm -qp --queryformat '%{VERSION}' "$rpm_path")" = "$version" ] || fail "RPM version is not $version"
ok "version $version"

rpm -qp --requires "$rpm_path" | grep -qx 'podman' || fail "the RPM does not require podman"
ok "requires podman"

files=$(rpm -qlp "$rpm_path")
for f in /usr/bin/agent-sandbox /usr/share/agent-sandbox/allowed-hosts /usr/share/man/man1/agent-sandbox.1 \
    /usr/share/bash-completion/completions/agent-sandbox /usr/share/zsh/site-functions/_agent-sandbox \
    /usr/share/fish/vendor_completions.d/agent-sandbox.fish /usr/share/doc/agent-sandbox/README.md \
    /usr/share/licenses/agent-sandbox/LICENSE; do
    grep -qx -- "$f" <<<"$files" || fail "$f is not in the RPM; it has:"$'\n'"$files"
done
ok "file list"

root="$scratch/root"
mkdir -p "$root"
rpm --root "$root" --initdb
rpm -i --nodeps --root "$root" "$rpm_path"
launcher="$root/usr/bin/agent-sandbox"
[ -x "$launcher" ] || fail "the installed launcher is missing"
"$launcher" --version | grep -q "$version" || fail "--version does not show $version"
report=$("$launcher" --print-config)
for image in "artifactapi.k8s.syd1.au.unkin.net/docker-internal/agent-sandbox:$version" \
    "artifactapi.k8s.syd1.au.unkin.net/docker-internal/agent-sandbox-router:$version"; do
    grep -qF -- "$image" <<<"$report" || fail "--print-config does not name $image:"$'\n'"$report"
done
grep -q 'localhost/' <<<"$report" && fail "the packaged launcher still names a local image:"$'\n'"$report"
cmp -s "$root/usr/share/agent-sandbox/allowed-hosts" packaging/allowed-hosts || fail "the packaged allowlist differs"
grep -q 'agent-sandbox' "$root/usr/share/bash-completion/completions/agent-sandbox" || fail "empty bash completion"
grep -qF -- '\-\-exec' "$root/usr/share/man/man1/agent-sandbox.1" || fail "the man page does not document --exec"
for word in allow deny reload sessions blocked doctor; do
    page=$(find "$root/usr/share/man/man1" -name "agent-sandbox-$word.1*" | head -n 1)
    [ -n "$page" ] || fail "no man page agent-sandbox-$word(1)"
    grep -q "$word" "$root/usr/share/bash-completion/completions/agent-sandbox" ||
        fail "the bash completion does not know $word"
done
ok "installed into a scratch root; --version and --print-config name the version and the pinned images"

clone="$scratch/clone"
git clone -q . "$clone"
(
    cd "$clone"
    git config user.email test@example.invalid
    git config user.name "packaging test"
    # Uncommitted work is refused.
    echo "# dirty" >>README.md
    if packaging/bump-version.sh patch >/dev/null 2>&1; then fail "a dirty tree was bumped"; fi
    git checkout -q README.md
    IFS=. read -r major minor _ <<<"$version"
    packaging/bump-version.sh minor >/dev/null
    want="$major.$((minor + 1)).0"
    [ "$(packaging/version.sh)" = "$want" ] || fail "Cargo.toml has $(packaging/version.sh), not $want"
    grep -q "^Version: *$want\$" packaging/agent-sandbox.spec || fail "the spec is not at $want"
    grep -A1 '^name = "agent-sandbox"$' Cargo.lock | grep -q "version = \"$want\"" || fail "Cargo.lock not bumped"
    [ "$(git describe --exact-match --tags HEAD)" = "v$want" ] || fail "HEAD is not tagged v$want"
    [ -z "$(git status --porcelain)" ] || fail "the bump left uncommitted changes"
    packaging/bump-version.sh patch >/dev/null
    [ "$(git describe --exact-match --tags HEAD)" = "v$major.$((minor + 1)).1" ] || fail "patch bump"
    packaging/bump-version.sh major >/dev/null
    [ "$(git describe --exact-match --tags HEAD)" = "v$((major + 1)).0.0" ] || fail "major bump"
)
ok "make patch|minor|major in a temporary clone"

echo "$passed passed, 0 failed"
