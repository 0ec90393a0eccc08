#!/usr/bin/env bash
# Makes a local Debian base image for the sandbox image with debootstrap, for machines that cannot pull
# docker.io/library/debian:bookworm-slim (the test machines have no registry). Does nothing if the image
# exists.
#
#   tests/e2e/make-base.sh [IMAGE]      (default localhost/debian:bookworm)
set -euo pipefail

image=${1:-localhost/debian:bookworm}
if podman image exists "$image"; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "make-base.sh: debootstrap needs root; run it as root, or set SANDBOX_BASE to an image you can pull" >&2
    exit 1
fi
command -v debootstrap >/dev/null || {
    echo "make-base.sh: debootstrap is not installed (apt-get install debootstrap)" >&2
    exit 1
}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "make-base.sh: debootstrap bookworm into $dir (about a minute)"
# Progress instead of silence: debootstrap's stage lines, and every 20th package of the per-package ones
# (retrieving, validating, extracting, unpacking, configuring); the whole log is shown on failure.
debootstrap --variant=minbase bookworm "$dir/root" http://deb.debian.org/debian 2>&1 | tee "$dir/log" |
    awk '(NF == 4 && $2 ~ /^(Retrieving|Validating|Extracting)$/) ||
         (NF == 3 && $2 ~ /^(Unpacking|Configuring)$/ && $3 ~ /\.\.\.$/) {
            sub(/\.\.\.$/, "", $3); n[$2]++; if (n[$2] % 20 != 1) next
            printf "make-base.sh:   %s %s (package %d)\n", tolower($2), $3, n[$2]; fflush(); next }
         /^I: / { print "make-base.sh: " substr($0, 4); fflush() }' || {
    tail -20 "$dir/log" >&2
    exit 1
}
echo "make-base.sh: importing it as $image"
tar -C "$dir/root" -c . | podman import --quiet - "$image" >/dev/null
echo "make-base.sh: built $image"
