#!/usr/bin/env bash
# DistFlow's main job on a CPU machine: 2 processes, real Megatron-Core (TP=2 over gloo) and the real
# SGLang engine, on a tiny model made locally. Sets up .venv first if needed.
# Usage: bash ci/quickstart.sh [section.key=value ...]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/ci/setup.sh"
source "$repo/ci/cpu_env.sh"
cd "$repo"
py="$repo/.venv/bin/python"
model="outputs/tiny-qwen2"
if [[ ! -f "$model/model.safetensors" ]]; then
  "$py" tools/make_tiny_model.py --family qwen2 --out "$model"
fi
exec timeout 1200 "$py" -m torch.distributed.run --standalone --nproc-per-node 2 \
  -m distflow.train examples/configs/smoke_cpu.yaml model.path="$model" "$@"
