#!/usr/bin/env bash
# `make patch|minor|major`: bumps the workspace version in Cargo.toml, Cargo.lock and the RPM spec,
# commits, and tags vX.Y.Z. Refuses on a dirty tree, so a release is exactly a reviewed commit.
set -euo pipefail
cd "$(dirname "$0")/.."

part=${1:-}
case "$part" in
    patch | minor | major) ;;
    *) echo "usage: $0 patch|minor|major" >&2; exit 2 ;;
esac
if [ -n "$(git status --porcelain)" ]; then
    echo "the work tree has uncommitted changes; commit or stash them before a version bump" >&2
    exit 1
fi

old=$(packaging/version.sh)
IFS=. read -r major minor patch <<<"$old"
case "$part" in
    patch) patch=$((patch + 1)) ;;
    minor) minor=$((minor + 1)); patch=0 ;;
    major) major=$((major + 1)); minor=0; patch=0 ;;
esac
new="$major.$minor.$patch"
if git rev-parse -q --verify "refs/tags/v$new" >/dev/null; then
    echo "tag v$new already exists" >&2
    exit 1
fi

# Cargo.toml: only the [workspace.package] version line.
awk -v new="$new" '
    /^\[workspace.package\]/ {in_pkg=1}
    /^\[/ && !/^\[workspace.package\]/ {in_pkg=0}
    in_pkg && /^version *=/ && !done {print "version = \"" new "\""; done=1; next}
    {print}' Cargo.toml >Cargo.toml.new
mv Cargo.toml.new Cargo.toml
# Cargo.lock: the workspace members' entries (they carry no checksum).
members=$(cargo metadata --no-deps --format-version 1 --offline |
    python3 -c 'import json,sys; print("\n".join(p["name"] for p in json.load(sys.stdin)["packages"]))')
for m in $members; do
    awk -v name="$m" -v old="$old" -v new="$new" '
        $0 == "name = \"" name "\"" {hit=1; print; next}
        hit && $0 == "version = \"" old "\"" {print "version = \"" new "\""; hit=0; next}
        {hit=0; print}' Cargo.lock >Cargo.lock.new
    mv Cargo.lock.new Cargo.lock
done
# The spec: Version, Release back to 1, and a changelog entry.
stamp="$(LC_ALL=C date '+%a %b %d %Y') $(git config user.name || echo agent-sandbox developers)"
awk -v new="$new" -v stamp="$stamp" '
    /^Version:/ {sub(/[0-9][0-9.]*/, new)}
    /^Release:/ {sub(/[0-9]+/, "1")}
    {print}
    /^%changelog/ {print "* " stamp " - " new "-1"; print "- Release " new "."; print ""}' \
    packaging/agent-sandbox.spec >packaging/agent-sandbox.spec.new
mv packaging/agent-sandbox.spec.new packaging/agent-sandbox.spec

git add Cargo.toml Cargo.lock packaging/agent-sandbox.spec
git commit -q -m "Release v$new"
git tag -a "v$new" -m "agent-sandbox v$new"
echo "v$old -> v$new (committed and tagged; push with: git push --follow-tags)"
