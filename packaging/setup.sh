#!/usr/bin/env bash
# `make setup` and `make setup-test`: gets this machine ready to build and run agent-sandbox, as root.
#
#   packaging/setup.sh           what the launcher and `make build` need ([setup] in the package list)
#   packaging/setup.sh --test    that and what only the tests need ([test])
#
# - Installs the missing packages of packaging/setup/apt.txt (Debian, Ubuntu) or dnf.txt (Fedora, RHEL)
#   with the host's package manager; the lists are the one place that names them.
# - Gives the invoking user (SUDO_USER) a /etc/subuid and /etc/subgid range if they have none, after every
#   range already there, so that rootless podman works for them.
# - Makes /dev/net/tun usable by ordinary users (rootless podman's networking) where it is not.
# - Checks for a Rust toolchain (the invoking user's) and says how to get one; never downloads one.
# Idempotent: each step prints `ok:` when it was already fine and `changed:` when it changed something, and
# the last line is `setup: done, changed nothing` or `setup: done, N changes`. Exit status: 0 ready, 1 error,
# 2 done but no usable Rust toolchain (so `sudo make setup && make build` stops with the reason above).
#
# Works without make (a fresh machine may lack it): `sudo packaging/setup.sh` is the same as `sudo make setup`.
# SETUP_OS_RELEASE names another os-release file (tests only).
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=false
case "${1:-}" in
    "") ;;
    --test) want_test=true ;;
    *)
        echo "usage: packaging/setup.sh [--test]" >&2
        exit 1
        ;;
esac

say() { printf 'setup: %s\n' "$*"; }
changes=0
changed() {
    say "changed: $*"
    changes=$((changes + 1))
}
ok() { say "ok: $*"; }
die() {
    say "error: $*" >&2
    exit 1
}

if [ "$(id -u)" != 0 ]; then
    die "needs root to install packages and edit /etc/subuid: run \`sudo make setup\` (or \`sudo packaging/setup.sh\`)"
fi

# Which list: the distribution family from os-release (ID, then ID_LIKE).
os_release=${SETUP_OS_RELEASE:-/etc/os-release}
[ -r "$os_release" ] || die "cannot read $os_release to tell the distribution"
ids=$(
    # shellcheck disable=SC1090
    . "$os_release"
    echo "${ID:-} ${ID_LIKE:-}"
)
family=
for id in $ids; do
    case "$id" in
        debian | ubuntu) family=apt ;;
        fedora | rhel | centos) family=dnf ;;
        *) continue ;;
    esac
    break
done
[ -n "$family" ] || die "unsupported distribution (os-release ID and ID_LIKE: $ids); install the packages \
in packaging/setup/apt.txt or dnf.txt by hand"
list=packaging/setup/$family.txt
[ -r "$list" ] || die "cannot read $list"

# The packages of the wanted sections, one a line: comments and blank lines dropped.
sections=setup
$want_test && sections="setup test"
packages() {
    awk -v want=" $sections " '
        { sub(/#.*/, "") }
        /^[[:space:]]*\[/ { gsub(/[][[:space:]]/, ""); section = $0; next }
        NF && index(want, " " section " ") { print $1 }
    ' "$list"
}
mapfile -t wanted < <(packages)
[ "${#wanted[@]}" -gt 0 ] || die "$list lists no packages for: $sections"

installed() {
    case "$family" in
        apt) [ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$1" 2>/dev/null | cut -c1-2)" = ii ] ;;
        # --whatprovides: a name may be provided by another package (iptables-nft for iptables, ...).
        dnf) rpm -q --whatprovides "$1" >/dev/null 2>&1 ;;
    esac
}

say "$family packages from $list ([${sections// /] [}])"
missing=()
for p in "${wanted[@]}"; do
    installed "$p" || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
    ok "all ${#wanted[@]} packages already installed"
else
    say "installing ${#missing[@]} of ${#wanted[@]} packages: ${missing[*]}"
    case "$family" in
        apt)
            command -v apt-get >/dev/null || die "apt-get not found"
            export DEBIAN_FRONTEND=noninteractive
            apt-get update || die "apt-get update failed"
            apt-get install -y "${missing[@]}" || die "apt-get install failed"
            ;;
        dnf)
            command -v dnf >/dev/null || die "dnf not found"
            dnf install -y "${missing[@]}" || die "dnf install failed"
            ;;
    esac
    still=()
    for p in "${missing[@]}"; do
        installed "$p" || still+=("$p")
    done
    [ "${#still[@]}" -eq 0 ] || die "still not installed after the install: ${still[*]}"
    changed "installed ${missing[*]}"
    # The tests run nginx as an upstream of their own; Debian's package starts a system nginx on port 80,
    # which nothing here wants listening.
    for p in "${missing[@]}"; do
        case "$p" in
            nginx | nginx-light)
                if command -v systemctl >/dev/null && systemctl is-enabled --quiet nginx 2>/dev/null; then
                    systemctl disable --now nginx >/dev/null 2>&1 || true
                    changed "stopped and disabled the system nginx the package started (the tests run their own)"
                fi
                ;;
        esac
    done
fi

# Subordinate ids for the invoking user. A new range starts after the end of every range in either file
# (never below 100000, the usual first one), rounded up to a multiple of 65536, so it overlaps none.
user=${SUDO_USER:-}
if [ -z "$user" ] || [ "$user" = root ]; then
    ok "run as root, not through sudo: no user to give /etc/subuid and /etc/subgid ranges to (run \`sudo make setup\` as the user who will run agent-sandbox)"
else
    uid=$(id -u "$user" 2>/dev/null) || die "SUDO_USER $user does not exist"
    has_range() { [ -f "$1" ] && awk -F: -v u="$user" -v i="$uid" '$1 == u || $1 == i { f = 1 } END { exit !f }' "$1"; }
    need=()
    has_range /etc/subuid || need+=(subuid)
    has_range /etc/subgid || need+=(subgid)
    if [ "${#need[@]}" -eq 0 ]; then
        ok "$user already has /etc/subuid and /etc/subgid ranges"
    else
        count=65536
        start=$(cat /etc/subuid /etc/subgid 2>/dev/null | awk -F: -v c="$count" '
            NF >= 3 && $2 ~ /^[0-9]+$/ && $3 ~ /^[0-9]+$/ && $2 + $3 > end { end = $2 + $3 }
            END { if (end < 100000) end = 100000; printf "%.0f\n", int((end + c - 1) / c) * c }')
        end=$((start + count - 1))
        [ "$end" -le 4294967294 ] || die "no free subordinate id range left above $start"
        flags=()
        for f in "${need[@]}"; do
            # usermod refuses to add a range when the file does not exist yet.
            [ -e "/etc/$f" ] || install -m 0644 /dev/null "/etc/$f"
            case "$f" in
                subuid) flags+=(--add-subuids "$start-$end") ;;
                subgid) flags+=(--add-subgids "$start-$end") ;;
            esac
        done
        usermod "${flags[@]}" "$user" || die "usermod ${flags[*]} $user failed"
        for f in "${need[@]}"; do
            has_range "/etc/$f" || die "usermod did not add $user to /etc/$f"
        done
        files=/etc/${need[0]}
        [ "${#need[@]}" -eq 1 ] || files="/etc/subuid and /etc/subgid"
        changed "gave $user the range $start-$end ($count ids) in $files"
    fi
fi

# Rootless podman's networking (slirp4netns, pasta) opens /dev/net/tun as the user; distributions make it
# 0666, some minimal machines leave it 0600. The mode lasts until the next boot (devtmpfs).
if [ -c /dev/net/tun ]; then
    if [ "$(stat -c %a /dev/net/tun)" = 666 ]; then
        ok "/dev/net/tun is usable by every user"
    else
        chmod 0666 /dev/net/tun
        changed "made /dev/net/tun usable by every user (mode 0666, as distributions ship it; until the next boot)"
    fi
else
    ok "no /dev/net/tun here (a container?): nothing to do"
fi

# The Rust toolchain of the user who will build: theirs under sudo (rustup installs into their home), run
# as them so that rustup never writes into their home as root.
rust_user=${user:-root}
rust_home=$(getent passwd "$rust_user" | cut -d: -f6)
need_rust=$(awk -F'"' '/^rust-version *=/ { print $2; exit }' Cargo.toml)
as_user() {
    if [ "$rust_user" = root ]; then
        env HOME="$rust_home" PATH="$rust_home/.cargo/bin:$PATH" "$@"
    else
        runuser -u "$rust_user" -- env HOME="$rust_home" PATH="$rust_home/.cargo/bin:$PATH" "$@"
    fi
}
rust_ok=true
rustc_version=$(as_user rustc --version 2>/dev/null | awk '{ print $2 }') || rustc_version=
if [ -z "$rustc_version" ] || ! as_user cargo --version >/dev/null 2>&1; then
    rust_ok=false
    say "MISSING: a Rust toolchain (cargo and rustc $need_rust or newer) for $rust_user; setup does not download toolchains."
elif ! printf '%s\n%s\n' "$need_rust" "${rustc_version%%-*}" | sort -V -C; then
    rust_ok=false
    say "MISSING: Rust $need_rust or newer for $rust_user: rustc is $rustc_version."
else
    ok "Rust toolchain for $rust_user: rustc $rustc_version (the workspace needs $need_rust)"
    if $want_test; then
        if as_user cargo fmt --version >/dev/null 2>&1 && as_user cargo clippy --version >/dev/null 2>&1; then
            ok "rustfmt and clippy (make lint) are there"
        else
            say "note: make lint needs rustfmt and clippy: as $rust_user, rustup component add rustfmt clippy"
        fi
    fi
fi
if ! $rust_ok; then
    say "  Install one as $rust_user with rustup (https://rustup.rs), then open a new shell or run . ~/.cargo/env:"
    say "      curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh"
    [ "$family" = dnf ] && say "  or, where the distribution's is new enough: dnf install cargo rustc rustfmt clippy"
    say "  then run setup again to check."
fi

if [ "$changes" -eq 0 ]; then
    summary="setup: done, changed nothing"
else
    summary="setup: done, $changes change$([ "$changes" = 1 ] || echo s) (the changed: lines above)"
fi
if $rust_ok; then
    echo "$summary"
else
    echo "$summary; still needed: a Rust toolchain (see above)"
    exit 2
fi
