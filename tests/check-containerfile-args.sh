#!/usr/bin/env bash
# Every `ARG NAME` in a Containerfile must be documented: a comment in the same file names it (the
# header block or the lines above it). Build arguments are part of an image's interface.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
checked=0
while IFS= read -r file; do
    [ -f "$file" ] || continue
    comments=$(grep -E '^[[:space:]]*#' "$file" || true)
    while IFS=: read -r line name; do
        [ -n "$name" ] || continue
        checked=$((checked + 1))
        if ! grep -qw -- "$name" <<<"$comments"; then
            echo "$file:$line: ARG $name is not documented in a comment of $file" >&2
            status=1
        fi
    done < <(awk '/^[[:space:]]*ARG[[:space:]]/ { split($2, a, "="); print NR ":" a[1] }' "$file")
done < <(git ls-files --cached --others --exclude-standard | grep -E '(^|/)Containerfile$')
echo "Containerfile build arguments: $checked checked" >&2
exit "$status"
