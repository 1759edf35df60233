#!/usr/bin/env bash
# DistFlow's main job on a CPU machine: GRPO on a tiny model made locally, 2 processes, real Megatron-Core
# (actor TP=2 over gloo), one real SGLang engine per rank. Prints the reward curve and plots it.
# Sets up .venv first if needed.
# Usage: bash ci/quickstart.sh [section.key=value ...]     (e.g. trainer.total_steps=40)
#        bash ci/quickstart.sh smoke                       the SFT + export + SGLang check instead
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/ci/setup.sh"
source "$repo/ci/cpu_env.sh"
cd "$repo"
py="$repo/.venv/bin/python"
model="outputs/tiny-qwen2"
if [[ ! -f "$model/model.safetensors" ]]; then
  "$py" tools/make_tiny_model.py --family qwen2 --out "$model" --vocab 300
fi
run=(timeout 1800 "$py" -m torch.distributed.run --standalone --nproc-per-node 2 -m distflow.train)
if [[ "${1:-}" == "smoke" ]]; then
  shift
  exec "${run[@]}" examples/configs/smoke_cpu.yaml model.path="$model" "$@"
fi
data="outputs/data/copy"
if [[ ! -f "$data/train.parquet" ]]; then
  "$py" tools/prepare_data.py copy --out "$data" --digits 4 --train 9000 --test 64 --seed 1
fi
out="outputs/grpo_copy"
rm -f "$out/metrics.jsonl"  # a fresh run each time (checkpoint resume of RL runs is not in yet)
"${run[@]}" examples/configs/grpo_copy_cpu.yaml model.path="$model" trainer.output_dir="$out" "$@"
"$py" - "$out/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("\nreward per step (mean over 8 samples x 32 prompts):")
for r in rows[::5] + ([rows[-1]] if (len(rows) - 1) % 5 else []):
    bar = "#" * int(40 * r["reward/mean"])
    val = f"  held-out {r['val/reward_mean']:.2f} (exact {r['val/accuracy']:.2f})" if "val/reward_mean" in r else ""
    print(f"  step {r['step']:3d}  {r['reward/mean']:.3f} {bar}{val}")
PY
"$py" tools/plot_metrics.py "$out"
