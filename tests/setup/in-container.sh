#!/usr/bin/env bash
# Runs inside the fresh Debian container of tests/setup/quickstart.sh, as root, in a read-only copy of the
# source tree at /src. Never run it on a real machine: it installs packages and adds users.
set -euo pipefail
[ -f /run/.containerenv ] || {
    echo "in-container.sh: not in a podman container; refusing to change this machine" >&2
    exit 1
}
cd /src

passed=0
fail() {
    echo "FAIL: $*" >&2
    echo "0 passed, 1 failed"
    exit 1
}
ok() {
    echo "ok: $*"
    passed=$((passed + 1))
}

# Runs setup (the arguments: a command line) as the user alice through sudo would: SUDO_USER set. Leaves
# the output in $out and the exit status in $status, and shows setup's own lines (apt's too on failure).
run_setup() {
    set +e
    out=$(env SUDO_USER=alice "$@" 2>&1)
    status=$?
    set -e
    if [ "$status" = 1 ]; then
        printf '%s\n' "$out" | tail -n 40 | sed 's/^/    | /'
    else
        printf '%s\n' "$out" | grep '^setup: ' | sed 's/^/    | /'
    fi
}
last_line() { printf '%s\n' "$out" | tail -n 1; }

# A user with no subordinate ids, and ranges of other users already there: alice's must overlap none.
useradd -m alice
for f in /etc/subuid /etc/subgid; do
    [ -e "$f" ] && sed -i '/^alice:/d' "$f"
done
printf 'bob:100000:65536\ncarol:165536:1000000\n' >>/etc/subuid
printf 'bob:100000:65536\n' >>/etc/subgid

# Not root: refused before anything is done.
set +e
msg=$(runuser -u alice -- packaging/setup.sh 2>&1)
st=$?
set -e
{ [ "$st" = 1 ] && grep -q 'needs root' <<<"$msg"; } || fail "setup as an ordinary user: status $st: $msg"
ok "setup as an ordinary user is refused with a reason"

command -v make >/dev/null && fail "the base image already has make: the test would not start from a fresh machine"

# 1. A fresh machine has no make: the script `make setup` runs (the README says so).
echo "== packaging/setup.sh (no make yet), no Rust toolchain for alice"
run_setup packaging/setup.sh
[ "$status" = 2 ] || fail "first setup: exit status $status, not 2 (ready but no Rust toolchain)"
grep -q '^setup: MISSING: a Rust toolchain' <<<"$out" || fail "no word about the missing Rust toolchain"
grep -q 'rustup' <<<"$out" || fail "setup does not say how to get a Rust toolchain"
grep -q '^setup: changed: installed ' <<<"$out" || fail "first setup installed nothing"
ok "first setup installed packages and named the missing Rust toolchain (status 2)"

for c in podman runc newuidmap newgidmap slirp4netns fuse-overlayfs catatonit make gcc pkg-config git ip nft \
    iptables; do
    command -v "$c" >/dev/null || fail "$c is not installed after make setup"
done
for f in /usr/lib/podman/netavark /usr/lib/podman/aardvark-dns; do
    [ -x "$f" ] || fail "$f is not installed after make setup"
done
[ -n "$(find /usr/lib -name libc.a -print -quit)" ] || fail "no static libc (libc.a) after make setup"
podman --version >/dev/null || fail "podman --version fails"
ok "the commands setup provides exist: podman, runc, netavark, aardvark-dns, catatonit, newuidmap, make, gcc, ..."
for c in shellcheck debootstrap rpm dnsmasq socat; do
    command -v "$c" >/dev/null && fail "$c is a test tool, but make setup installed it"
done
ok "no test-only tools installed by make setup"

# alice's range: after carol's (165536 + 1000000), rounded up to a multiple of 65536; overlapping nothing.
for f in /etc/subuid /etc/subgid; do
    grep -qx 'alice:1179648:65536' "$f" || fail "$f has no alice:1179648:65536: $(cat "$f")"
    awk -F: '{ s[NR] = $2; e[NR] = $2 + $3 } END {
        for (i = 1; i <= NR; i++) for (j = i + 1; j <= NR; j++)
            if (s[i] < e[j] && s[j] < e[i]) { print "overlap: lines " i " and " j; exit 1 } }' "$f" ||
        fail "$f has overlapping ranges: $(cat "$f")"
done
grep -qx 'carol:165536:1000000' /etc/subuid || fail "carol's range changed"
ok "alice got a subuid and subgid range after the others, overlapping none"

# 2. A Rust toolchain in alice's home (stand-ins answer --version), too old first.
install -d -o alice -g alice /home/alice/.cargo /home/alice/.cargo/bin
fake_rust() {
    for tool in cargo rustc; do
        printf '#!/bin/sh\necho "%s %s (stand-in)"\n' "$tool" "$1" >"/home/alice/.cargo/bin/$tool"
        chmod 0755 "/home/alice/.cargo/bin/$tool"
    done
}
fake_rust 1.63.0
echo "== make setup, Rust 1.63 for alice"
run_setup make --no-print-directory setup
{ [ "$status" = 2 ] && grep -q 'rustc is 1.63.0' <<<"$out"; } || fail "a too old Rust was not named (status $status)"
ok "a too old Rust toolchain is named"

fake_rust 1.85.0
echo "== make setup again, Rust 1.85 for alice"
run_setup make --no-print-directory setup
[ "$status" = 0 ] || fail "second make setup: exit status $status"
[ "$(last_line)" = "setup: done, changed nothing" ] || fail "second make setup changed something: $(last_line)"
grep -q '^setup: ok: Rust toolchain for alice: rustc 1.85.0' <<<"$out" || fail "alice's Rust toolchain not found"
grep -q '^setup: ok: alice already has /etc/subuid and /etc/subgid ranges' <<<"$out" || fail "ranges not seen"
[ "$(grep -c '^alice:' /etc/subuid)" = 1 ] || fail "a second range for alice"
ok "second make setup changed nothing"

# 3. make setup-test: the test tools on top, then nothing more.
echo "== make setup-test"
run_setup make --no-print-directory setup-test
[ "$status" = 0 ] || fail "make setup-test: exit status $status"
grep -q '^setup: changed: installed ' <<<"$out" || fail "make setup-test installed nothing"
for c in python3 busybox debootstrap dnsmasq dig socat curl openssl shellcheck rpm rpmbuild; do
    command -v "$c" >/dev/null || fail "$c is not installed after make setup-test"
done
[ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || fail "no Debian archive keyring for debootstrap"
ok "make setup-test installed the test tools"
echo "== make setup-test again"
run_setup make --no-print-directory setup-test
{ [ "$status" = 0 ] && [ "$(last_line)" = "setup: done, changed nothing" ]; } ||
    fail "second make setup-test: status $status, $(last_line)"
ok "second make setup-test changed nothing"

# 4. The dnf path, with stand-ins for dnf and rpm that record what they were asked (no Fedora machine here):
# every package of dnf.txt is asked for once, and the second run asks for nothing.
stub=$(mktemp -d)
mkdir "$stub/bin" "$stub/installed"
printf 'ID=fedora\nVERSION_ID=43\n' >"$stub/os-release"
cat >"$stub/bin/dnf" <<EOF
#!/bin/sh
echo "\$*" >>"$stub/dnf-calls"
[ "\$1 \$2" = "install -y" ] || exit 1
shift 2
for p in "\$@"; do touch "$stub/installed/\$p"; done
EOF
cat >"$stub/bin/rpm" <<EOF
#!/bin/sh
[ "\$1 \$2" = "-q --whatprovides" ] || exit 1
[ -e "$stub/installed/\$3" ]
EOF
chmod 0755 "$stub/bin/dnf" "$stub/bin/rpm"
want=$(sed 's/#.*//; /^\s*\[/d' packaging/setup/dnf.txt | awk 'NF { printf "%s ", $1 }')
echo "== packaging/setup.sh --test as on Fedora (stand-in dnf and rpm)"
run_setup env PATH="$stub/bin:$PATH" SETUP_OS_RELEASE="$stub/os-release" packaging/setup.sh --test
[ "$status" = 0 ] || fail "dnf setup: exit status $status"
[ "$(cat "$stub/dnf-calls")" = "install -y ${want% }" ] ||
    fail "dnf was asked for: $(cat "$stub/dnf-calls"), not: install -y $want"
run_setup env PATH="$stub/bin:$PATH" SETUP_OS_RELEASE="$stub/os-release" packaging/setup.sh --test
{ [ "$(wc -l <"$stub/dnf-calls")" = 1 ] && [ "$(last_line)" = "setup: done, changed nothing" ]; } ||
    fail "the second dnf setup was not a no-op: $(last_line)"
rm -rf "$stub"
ok "the dnf path installs every package of dnf.txt once, and the second run changes nothing"

echo "$passed passed, 0 failed"
