# shellcheck shell=bash
# Sourced by the end-to-end scripts that run inside the sandbox (launcher/tests/e2e). `t NAME CMD...`
# expects success, `f NAME CMD...` expects failure; each prints `ok NAME` or `FAIL NAME ...`, which the
# suite reads back from the sandbox's output.
t() { local n=$1; shift; if "$@" >/dev/null 2>&1; then echo "ok $n"; else echo "FAIL $n: $*"; fi; }
f() { local n=$1; shift; if "$@" >/dev/null 2>&1; then echo "FAIL $n (succeeded): $*"; else echo "ok $n"; fi; }
