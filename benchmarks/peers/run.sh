#!/usr/bin/env bash
# Build benchmarks/peers/.venv (the peers and this repo; none of it is a Conveyor dependency),
# then run the comparison: benchmarks/peers/run.sh [--tasks N] [--single N] [--idle N] [--only ...]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="$here/.venv"
PYTHON="${PYTHON:-python3}"
# The versions the README's figures were measured with.
PEERS=(pgqueuer==1.6.0 asyncpg==0.32.0 pgserver==0.1.4 'dramatiq[redis]==2.2.1' redis==8.1.0)

if [ ! -x "$venv/bin/python" ]; then
  "$PYTHON" -m venv "$venv"
fi
stamp="$venv/.installed"
if [ ! -f "$stamp" ] || [ "$repo/pyproject.toml" -nt "$stamp" ] || [ "$0" -nt "$stamp" ]; then
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q "${PEERS[@]}" -e "$repo"
  touch "$stamp"
fi
if ! command -v redis-server >/dev/null; then
  echo "redis-server is not installed (Debian: apt-get install -y redis-server)" >&2
  exit 1
fi
cd "$here"
exec "$venv/bin/python" compare.py "$@"
