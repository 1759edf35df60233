#!/usr/bin/env bash
# Creates .venv with DistFlow's pinned CPU stack (torch 2.13.0 CPU, megatron-core 0.16.1, SGLang 0.5.23 by
# its CPU route). Idempotent: a second run checks a stamp of the requirement files and returns at once.
# Usage: bash ci/setup.sh            (DISTFLOW_VENV=path to use another venv)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${DISTFLOW_VENV:-$repo/.venv}"
sglang_version="0.5.23"
stamp="$venv/.distflow-setup-stamp"

want="$(cat "$repo/requirements.txt" "$repo/ci/requirements-sglang-cpu.txt" "$repo/ci/constraints-cpu.txt" \
        "$repo/setup.py" "$repo/ci/setup.sh" | sha256sum | cut -d' ' -f1)-$repo"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "[setup] $venv is up to date"
  exit 0
fi

start=$SECONDS
if [[ ! -x "$venv/bin/python" ]]; then
  echo "[setup] creating $venv"
  python3 -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install -U pip
echo "[setup] installing the CPU stack (a few minutes the first time)"
# torch first and alone: with it in place no other package can pull a CUDA torch.
"${pip[@]}" install -c "$repo/ci/constraints-cpu.txt" torch==2.13.0
"${pip[@]}" install -c "$repo/ci/constraints-cpu.txt" -r "$repo/requirements.txt" \
  -r "$repo/ci/requirements-sglang-cpu.txt"
# sglang pins torch==2.14.1 (CUDA) and ~35 CUDA packages: take the wheel alone, its CPU-safe deps above.
"${pip[@]}" install --no-deps "sglang==$sglang_version"
"${pip[@]}" install --no-deps -e "$repo"
# Every interpreter of this venv loads the torchvision op-schema hook (see its docstring for why); a .pth
# file is the one place that reaches pytest, torchrun ranks and SGLang's spawned schedulers alike.
"$venv/bin/python" - "$repo/distflow/cpu_support/startup" <<'PY'
import sys, sysconfig, pathlib
pth = pathlib.Path(sysconfig.get_paths()["purelib"]) / "distflow_cpu_startup.pth"
pth.write_text(f"import sys; sys.path.append({sys.argv[1]!r}); import distflow_cpu_startup\n")
PY
"$venv/bin/python" -c "import transformers, torchvision" \
  || { echo "[setup] the CPU environment does not import transformers/torchvision" >&2; exit 1; }
echo "$want" > "$stamp"
echo "[setup] done in $((SECONDS - start)) s: $venv"
