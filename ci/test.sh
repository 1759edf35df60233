#!/usr/bin/env bash
# Runs DistFlow's test suite on this machine (sets up .venv first if needed).
# Usage: bash ci/test.sh [pytest args]      e.g. bash ci/test.sh tests/config -x
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/ci/setup.sh"
source "$repo/ci/cpu_env.sh"
cd "$repo"
# Format and lint first (seconds): a style error fails here, not after the 40-minute suite.
"$repo/.venv/bin/ruff" format --check --quiet . || { echo "[test] run: .venv/bin/ruff format ." >&2; exit 1; }
"$repo/.venv/bin/ruff" check --quiet . || { echo "[test] run: .venv/bin/ruff check --fix ." >&2; exit 1; }
# The outer timeout is a last resort: every test also has its own (pytest.ini) and every spawned job too.
exec timeout 3600 "$repo/.venv/bin/python" -m pytest "$@"
