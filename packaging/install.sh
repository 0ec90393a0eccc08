#!/usr/bin/env bash
# `make install`: copies the launcher that `make build` made to ~/.local/bin, or to /usr/local/bin as root
# (BINDIR=DIR to choose), and says where it went and whether that directory is on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

launcher=target/release/agent-sandbox
[ -x "$launcher" ] || {
    echo "make install: there is no $launcher yet: run make build first" >&2
    exit 1
}
if [ -n "${BINDIR:-}" ]; then
    dir=$BINDIR
elif [ "$(id -u)" = 0 ]; then
    dir=/usr/local/bin
else
    dir=$HOME/.local/bin
fi
install -d "$dir"
install -m 0755 "$launcher" "$dir/agent-sandbox"
echo "make install: installed $dir/agent-sandbox ($("$dir/agent-sandbox" --version))"
case ":$PATH:" in
    *":$dir:"*) echo "make install: run it in a project directory: cd your-project && agent-sandbox" ;;
    *) echo "make install: $dir is not on your PATH: add it (export PATH=\"$dir:\$PATH\" in your shell's rc file)" ;;
esac
