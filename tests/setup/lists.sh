#!/usr/bin/env bash
# The setup package lists (packaging/setup/{apt,dnf}.txt), checked without installing anything: each has a
# [setup] and a [test] section and nothing outside them, one well-formed package name a line, no name twice;
# every dnf name is in tests/data/fedora-packages.txt (there is no Fedora machine here to ask dnf). The
# apt path is exercised for real by `make quickstart-test`, the dnf path there with stand-ins.
set -euo pipefail
cd "$(dirname "$0")/../.."

passed=0
failed=0
ok() {
    echo "ok: $*"
    passed=$((passed + 1))
}
bad() {
    echo "FAIL: $*" >&2
    failed=$((failed + 1))
}

# Prints "LINE SECTION NAME" for each package, or "LINE error WHAT" for each malformed line.
entries() {
    awk '
        { sub(/#.*/, ""); sub(/[[:space:]]+$/, "") }
        !NF { next }
        /^\[/ {
            if ($0 !~ /^\[(setup|test)\]$/) { print NR, "error", "unknown section " $0; next }
            section = substr($0, 2, length($0) - 2)
            if (seen[section]++) print NR, "error", "section [" section "] twice"
            next
        }
        section == "" { print NR, "error", "package outside a section: " $0; next }
        NF > 1 { print NR, "error", "one package a line: " $0; next }
        { print NR, section, $1 }
    ' "$1"
}

for family in apt dnf; do
    list=packaging/setup/$family.txt
    case "$family" in
        apt) name_re='^[a-z0-9][a-z0-9+.-]+$' ;;
        dnf) name_re='^[A-Za-z0-9][A-Za-z0-9._+-]*$' ;;
    esac
    errors=0
    declare -A where=()
    sections=()
    while read -r line section name; do
        if [ "$section" = error ]; then
            bad "$list:$line: $name"
            errors=$((errors + 1))
            continue
        fi
        [[ " ${sections[*]} " == *" $section "* ]] || sections+=("$section")
        if ! [[ $name =~ $name_re ]]; then
            bad "$list:$line: \`$name\` is not a $family package name"
            errors=$((errors + 1))
        fi
        if [ -n "${where[$name]:-}" ]; then
            bad "$list:$line: $name is already on line ${where[$name]}"
            errors=$((errors + 1))
        fi
        where[$name]=$line
        if [ "$family" = dnf ] && ! grep -qxF -- "$name" tests/data/fedora-packages.txt; then
            bad "$list:$line: $name is not a Fedora package name in tests/data/fedora-packages.txt"
            errors=$((errors + 1))
        fi
    done < <(entries "$list")
    [ "${sections[*]}" = "setup test" ] || {
        bad "$list: sections are [${sections[*]}], not [setup] then [test]"
        errors=$((errors + 1))
    }
    [ "${#where[@]}" -ge 10 ] || {
        bad "$list: only ${#where[@]} packages read"
        errors=$((errors + 1))
    }
    [ "$errors" -eq 0 ] && ok "$list: ${#where[@]} packages in [setup] and [test], well formed"
    unset where
done

# The checker itself rejects what it should (so a broken list cannot pass by a blind checker).
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
printf 'podman\n[setup]\nmake gcc\n[other]\n' >"$scratch/bad.txt"
got=$(entries "$scratch/bad.txt" | awk '$2 == "error"' | wc -l)
if [ "$got" = 3 ]; then ok "malformed lines are reported (3 of 3)"; else bad "malformed lines reported: $got of 3"; fi

if bash -n packaging/setup.sh; then ok "packaging/setup.sh parses"; else bad "packaging/setup.sh does not parse"; fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
