#!/usr/bin/env bash
# Prints the workspace version ([workspace.package] version in Cargo.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
awk '/^\[workspace.package\]/ {in_pkg=1; next} /^\[/ {in_pkg=0} in_pkg && /^version *=/ {gsub(/"/, "", $3); print $3; exit}' Cargo.toml
