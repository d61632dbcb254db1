#!/usr/bin/env bash
# mypy names modules after folders, and our folders are mapped into one `conveyor` namespace by
# setuptools' package-dir. Lay that namespace out as symlinks so mypy sees what Python imports.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tree="$root/.build/typecheck"
rm -rf "$tree"
mkdir -p "$tree/conveyor"
for entry in "$root"/sdk/*; do
  ln -s "$entry" "$tree/conveyor/$(basename "$entry")"
done
for pkg in streams store agents schemas; do
  ln -s "$root/$pkg" "$tree/conveyor/$pkg"
done
echo "$tree"
