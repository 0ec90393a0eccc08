#!/usr/bin/env bash
# benches/merge-report.sh REPORT [TARGET]: puts a benchmark run's report (REPORT, a Markdown section that
# starts with a "## " heading) at the top of TARGET (default BENCHMARKS.md), under the file's title and
# preamble, and keeps every earlier section below it, newest first. `make bench` (benches/run.sh) calls
# it, so a new run never erases the measurements and analyses written before it.
set -euo pipefail
report=$1
target=${2:-BENCHMARKS.md}
head -n 1 "$report" | grep -q '^## ' || { echo "$report must start with a '## ' heading" >&2; exit 1; }
new=$(mktemp "$target.XXXXXX")
trap 'rm -f "$new"' EXIT
{
    echo "# Benchmarks"
    echo
    echo "Newest first. Each section says when and on which machine it ran. The load generators share the"
    echo "machine's cores with the servers, so compare ratios within one section, not absolute figures across"
    echo "sections or machines. \`make bench\` (benches/run.sh) adds a section at the top and keeps the rest."
    echo
    cat "$report"
    # Everything from the first section on; nothing if TARGET is new or has no section yet.
    if [ -f "$target" ] && grep -q '^## ' "$target"; then
        echo
        sed -n '/^## /,$p' "$target"
    fi
} >"$new"
chmod 644 "$new"
mv "$new" "$target"
trap - EXIT
