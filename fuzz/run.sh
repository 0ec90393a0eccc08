#!/usr/bin/env bash
# `make fuzz`: runs every cargo-fuzz target for FUZZ_SECONDS seconds (default 120) on nightly, installing
# cargo-fuzz from crates.io if it is missing. Any crash, hang (-timeout) or out-of-memory (-rss_limit_mb)
# fails the run; libFuzzer leaves the reproducer in fuzz/artifacts/TARGET/ (crash-*, timeout-*, oom-*,
# slow-unit-*), and `cargo +nightly fuzz run TARGET fuzz/artifacts/TARGET/FILE` replays it.
# New inputs found go to fuzz/work/TARGET/ (not checked in); the seeds in fuzz/corpus/TARGET/ are only read.
set -euo pipefail

seconds="${FUZZ_SECONDS:-120}"
targets="${FUZZ_TARGETS:-tls_hello tls_hello_structured tls_retry http_request dns_udp allowlist router_config inject_rewrite netlink_routes}"
# A single input taking longer than this is a hang.
timeout_secs="${FUZZ_TIMEOUT:-10}"
rss_mb="${FUZZ_RSS_MB:-2048}"
# Extra `cargo fuzz run` flags; none means release with debug assertions (overflow checks) on, and
# `-O` drops the assertions (a build without them is faster, and is a second build to wait for).
read -r -a build_flags <<<"${FUZZ_BUILD_FLAGS:-}"

cd "$(dirname "$0")"
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

failed=()
summary=()
for target in $targets; do
    mkdir -p "work/$target"
    corpora=("work/$target")
    if [[ -d "corpus/$target" ]]; then
        corpora+=("corpus/$target")
    fi
    log="work/$target.log"
    echo "== $target: ${seconds}s"
    if cargo +nightly fuzz run "${build_flags[@]}" "$target" "${corpora[@]}" -- \
        -max_total_time="$seconds" -timeout="$timeout_secs" -rss_limit_mb="$rss_mb" \
        -print_final_stats=1 >"$log" 2>&1; then
        result=ok
    else
        result=FAILED
        failed+=("$target")
        tail -n 40 "$log"
    fi
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    summary+=("$(printf '%-22s %6ss %12s execs  %s' "$target" "$seconds" "${execs:-?}" "$result")")
done

echo
printf '%s\n' "${summary[@]}"
if ((${#failed[@]})); then
    echo "failed: ${failed[*]} (reproducers in fuzz/artifacts/TARGET/, logs in fuzz/work/TARGET.log)" >&2
    exit 1
fi
