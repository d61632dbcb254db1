#!/usr/bin/env bash
# mypy names modules after folders, and our folders are mapped into one `conveyor` namespace by
# setuptools' package-dir. Lay that namespace out as symlinks so mypy sees what Python imports.
# The tree is updated in place (links added, dangling ones removed), never deleted and rebuilt,
# so two runs at once do not pull it from under each other.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tree="$root/.build/typecheck"
mkdir -p "$tree/conveyor"
link() {  # link TARGET NAME: point NAME at TARGET unless it already does
  [ "$(readlink "$2" 2>/dev/null)" = "$1" ] || ln -sfn "$1" "$2"
}
for entry in "$root"/sdk/*; do
  link "$entry" "$tree/conveyor/$(basename "$entry")"
done
for pkg in streams store agents schemas; do
  link "$root/$pkg" "$tree/conveyor/$pkg"
done
link "$root/devtools/conveyor_devtools" "$tree/conveyor_devtools"  # bench, chaos: not in the wheel
find "$tree/conveyor" -maxdepth 1 -xtype l -delete
echo "$tree"
