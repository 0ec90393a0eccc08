#!/usr/bin/env bash
# Run by `make build` between the cargo build and the image build. As an ordinary user, podman keeps images
# in the user's own (rootless) storage, apart from root's: when root's storage already has the images and
# the user's does not, copying them takes seconds where a rebuild takes minutes, so say how and stop
# (REBUILD=1 builds them anyway). Root's storage is only readable by root: it is asked through `sudo -n`,
# which never prompts; where that is not allowed, the copy command is shown as a hint and the build goes on.
#
#   packaging/rootless-images.sh LAUNCHER     (the freshly built launcher names the images it uses)
set -euo pipefail

launcher=${1:?usage: packaging/rootless-images.sh LAUNCHER}
[ "$(id -u)" != 0 ] || exit 0
mapfile -t images < <("$launcher" --print-config | awk -F': +' '/^(sandbox|router) image:/ { print $2 }')
[ "${#images[@]}" -eq 2 ] || {
    echo "make build: cannot read the image names from $launcher --print-config" >&2
    exit 1
}
missing=()
for image in "${images[@]}"; do
    podman image exists "$image" 2>/dev/null || missing+=("$image")
done
if [ "${#missing[@]}" -eq 0 ]; then
    echo "make build: rebuilding ${images[*]} in $(id -un)'s rootless podman storage"
    exit 0
fi

copy_hint() {
    for image in "${missing[@]}"; do
        echo "    sudo podman save $image | podman load"
    done
}
root_has_them=unknown
if sudo -n true 2>/dev/null; then
    root_has_them=yes
    for image in "${missing[@]}"; do
        sudo -n podman image exists "$image" 2>/dev/null || root_has_them=no
    done
fi
if [ "$root_has_them" = yes ] && [ -z "${REBUILD:-}" ]; then
    echo "make build: ${missing[*]} are in root's podman storage but not in yours ($(id -un), rootless)." >&2
    echo "Copy them instead of rebuilding (seconds rather than minutes):" >&2
    copy_hint >&2
    echo "or build them in your storage anyway: make build REBUILD=1" >&2
    exit 1
fi
echo "make build: building ${missing[*]} into $(id -un)'s rootless podman storage (several minutes the first time)."
if [ "$root_has_them" = unknown ]; then
    echo "  If root has built them already (sudo make build, make test as root), copying is faster:"
    copy_hint
fi
