#!/usr/bin/env bash
# benches/merge-report.sh keeps the measurement record: a new run's report goes on top of BENCHMARKS.md,
# every earlier section stays below it unchanged, a report without a section heading is refused and leaves
# the file as it was, and a missing file is created. Runs on a copy; the real BENCHMARKS.md is not touched.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "check-merge-report: $*" >&2; exit 1; }

cp BENCHMARKS.md "$dir/bench.md"
printf '## 2099-01-01 00:00 UTC: a test run\n\nnew figures\n\n### DNS\n\nx\n' >"$dir/report.md"
benches/merge-report.sh "$dir/report.md" "$dir/bench.md"
[ "$(head -n 1 "$dir/bench.md")" = "# Benchmarks" ] || fail "the title is not first"
[ "$(grep -m 1 '^## ' "$dir/bench.md")" = '## 2099-01-01 00:00 UTC: a test run' ] ||
    fail "the new run is not the first section"
# From the second section on, the merged file must be the old one from its first section on.
cmp -s <(sed -n '/^## /,$p' BENCHMARKS.md) <(awk '/^## / {n++} n >= 2' "$dir/bench.md") ||
    fail "an earlier section was lost or changed"

cp "$dir/bench.md" "$dir/before.md"
printf 'no heading\n' >"$dir/bad.md"
if benches/merge-report.sh "$dir/bad.md" "$dir/bench.md" 2>/dev/null; then fail "a report without a heading was accepted"; fi
cmp -s "$dir/bench.md" "$dir/before.md" || fail "a refused report changed the file"

benches/merge-report.sh "$dir/report.md" "$dir/new.md"
[ "$(grep -c '^## ' "$dir/new.md")" = 1 ] || fail "a new file should hold the one new section"
[ -z "$(find "$dir" -name '*.md.*')" ] || fail "a temporary file was left behind"
echo "merge-report: the record is kept" >&2
