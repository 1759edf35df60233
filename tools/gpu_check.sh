#!/usr/bin/env bash
# tools/gpu_check.py on a CUDA machine that has PyTorch but not DistFlow's other dependencies: the wheels
# carried in --wheels DIR (default gpu_wheels/ at the repository root; docs/gpu_validation.md says how to fill
# it) go into a temporary folder on PYTHONPATH first. Every other argument goes to gpu_check.py, e.g.
#   bash tools/gpu_check.sh --out gpu_out --budget-s 480
# $PYTHON picks the interpreter (default: python on PATH).
set -euo pipefail
PYTHON="${PYTHON:-python}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEELS="$REPO/gpu_wheels"
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --wheels) WHEELS="$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
SITE="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-site.XXXXXX")"
trap 'rm -rf "$SITE"' EXIT
if [[ -d "$WHEELS" ]]; then
  "$PYTHON" "$REPO/tools/gpu_checks/install_wheels.py" "$WHEELS" "$SITE"
fi
export PYTHONPATH="$REPO:$REPO/tools:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export GPU_CHECK_WHEELS="$WHEELS"
"$PYTHON" "$REPO/tools/gpu_check.py" "${args[@]}"
