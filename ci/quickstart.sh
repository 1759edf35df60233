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
# Hidden 128 / FFN 512 (~0.5M parameters): the size that solves the copy task in 80 steps here (held-out
# exact match 0.02 -> ~0.95); the tests' hidden-64 model learns too, but too slowly to show it in minutes.
model="outputs/tiny-qwen2-h128"
if [[ ! -f "$model/model.safetensors" ]]; then
  "$py" tools/make_tiny_model.py --family qwen2 --out "$model" --vocab 300 --hidden 128 --ffn 512 --heads 4 --kv-heads 2
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
# Every run of the main job is a fresh run with the same result: the last run's folder is kept beside it
# (one copy) rather than resumed, since a finished run resumed would train no step. To continue a run, call
# torchrun directly with trainer.output_dir=... (checkpoint.resume=auto takes its latest checkpoint).
if [[ -e "$out" ]]; then
  rm -rf "$out.previous"
  mv "$out" "$out.previous"
  echo "[quickstart] the last run is kept in $out.previous; this one starts fresh in $out"
fi
"${run[@]}" examples/configs/grpo_copy_cpu.yaml model.path="$model" trainer.output_dir="$out" "$@"
"$py" tools/summarize_run.py "$out"
cat <<'TXT'
What the numbers mean: each prompt is 4 digits and the answer is the same 4 digits then EOS. The reward is
the fraction of positions of (answer + EOS) the response got right: 1.0 is a perfect copy that stops. The
random model scores about 0.05; 12 supervised warm-up steps before step 1 bring it to about 0.3, and GRPO
does the rest. "held-out" is the greedy reward on 64 prompts never trained on, and "exact" the fraction of
them answered perfectly: the task is solved when exact nears 1.0 (on a 2-core machine: ~0.95 at step 80).
TXT
"$py" tools/plot_metrics.py "$out"
