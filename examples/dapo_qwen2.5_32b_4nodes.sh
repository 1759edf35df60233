#!/usr/bin/env bash
# DAPO on Qwen2.5-32B, 4 nodes x 8 GPUs, colocated: Megatron TP 4 x PP 2 x DP 4, 8 SGLang engines of TP 4.
# DAPO (arXiv 2503.14476): clip-higher (0.2 / 0.28), dynamic sampling (drop groups whose rewards are all
# equal, generate again), token-level loss, overlong reward shaping, no KL term (no reference model).
#
#   NNODES=4 NODE_RANK=<0..3> MASTER_ADDR=<node 0> MODEL_PATH=/models/Qwen2.5-32B \
#       bash examples/dapo_qwen2.5_32b_4nodes.sh [section.key=value ...]      # on every node
#   sbatch --nodes 4 examples/slurm/sbatch_distflow.sh examples/dapo_qwen2.5_32b_4nodes.sh
#   DRY_RUN=1 bash examples/dapo_qwen2.5_32b_4nodes.sh     # plan only, on any machine
# Data: DAPO's own parquet files, already in the RL schema, each prompt asking for a last line "Answer: ...",
# data_source math_dapo (scored by reward.name=auto with DAPO's rule, +1 / -1: distflow/rewards/math_dapo.py):
#   huggingface-cli download --repo-type dataset BytedTsinghua-SIA/DAPO-Math-17k --local-dir /data/dapo-math-17k
#   huggingface-cli download --repo-type dataset BytedTsinghua-SIA/AIME-2024 --local-dir /data/aime-2024
set -euo pipefail

# ---- cluster: torchrun's rendezvous (SLURM: examples/slurm/sbatch_distflow.sh sets these) ----
NNODES=${NNODES:-4}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
GPU_MEMORY_GB=${GPU_MEMORY_GB:-80}          # for the dry run's memory check (80: H100/A100 80GB)
BANDWIDTH_GBPS=${BANDWIDTH_GBPS:-400}       # per-GPU link, for the dry run's weight-sync estimate
WORLD_SIZE=$((NNODES * GPUS_PER_NODE))

# ---- paths and run names ----
REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODEL_PATH=${MODEL_PATH:-/models/Qwen2.5-32B}
SHIPPED_MODEL_CONFIG=${REPO_DIR}/examples/model_configs/qwen2.5-32b.json
TRAIN_FILES=${TRAIN_FILES:-/data/dapo-math-17k/data/dapo-math-17k.parquet}   # data_source math_dapo
VAL_FILES=${VAL_FILES:-/data/aime-2024/data/aime-2024.parquet}                # data_source math_dapo
CKPT_DIR=${CKPT_DIR:-/checkpoints/dapo_qwen2.5_32b_4nodes}   # on a file system every node sees
WANDB_PROJECT=${WANDB_PROJECT:-distflow}
WANDB_RUN=${WANDB_RUN:-dapo_qwen2.5_32b_4nodes}
PYTHON=${PYTHON:-python}
CONFIG=${REPO_DIR}/examples/configs/gpu_base.yaml

MAX_PROMPT=2048
MAX_RESPONSE=$((1024 * 20))                      # DAPO's 20k-token responses
OVERLONG_BUFFER=4096                             # the last 4k tokens before the limit are penalised linearly

MODEL_ARGS=(
    model.path="${MODEL_PATH}"
)
ACTOR_ARGS=(
    actor.tp=4 actor.pp=2                        # 32.8 B params: 4.1 B per GPU; DP 4
    actor.sequence_parallel=true
    actor.max_tokens_per_micro_batch=$((MAX_PROMPT + MAX_RESPONSE))   # one full-length sample per micro-batch
    actor.recompute_granularity=full
    actor.recompute_method=uniform
    actor.recompute_num_layers=1
    actor.mini_batch_size=32                     # prompts per optimizer step: 16 updates per RL step
    actor.optim.lr=1.0e-6
    actor.optim.lr_warmup_steps=10
    actor.optim.weight_decay=0.1
)
ROLLOUT_ARGS=(
    rollout.placement=colocated
    rollout.engine_tp=4                          # 8 engines: 15 GiB of weights per GPU
    rollout.n=16
    rollout.max_new_tokens=${MAX_RESPONSE}
    rollout.temperature=1.0 rollout.top_p=1.0
    rollout.mem_fraction_static=0.85
)
ALGO_ARGS=(
    dag.pipeline=dapo
    algorithm.adv_estimator=grpo
    algorithm.clip_ratio_low=0.2 algorithm.clip_ratio_high=0.28   # clip-higher
    algorithm.loss_agg_mode=token-mean                            # token-level policy-gradient loss
    algorithm.kl_coef=0.0 ref.enable=false                        # no KL term, no reference model
    algorithm.dynamic_sampling=true algorithm.max_sampling_attempts=3
    algorithm.overlong_buffer_len=${OVERLONG_BUFFER} algorithm.overlong_penalty_factor=1.0
)
DATA_ARGS=(
    data.train_files="[${TRAIN_FILES}]"
    data.val_files="[${VAL_FILES}]"
    data.max_prompt_length=${MAX_PROMPT}
    data.train_batch_size=512                    # prompts kept per step (after dynamic sampling)
    reward.name=auto
)
RUN_ARGS=(
    trainer.total_steps=400
    trainer.val_every=5
    trainer.output_dir="${CKPT_DIR}"
    checkpoint.save_every=10
    checkpoint.resume=auto
    tracking.project="${WANDB_PROJECT}"
    tracking.run_name="${WANDB_RUN}"
)
OVERRIDES=("${MODEL_ARGS[@]}" "${ACTOR_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${ALGO_ARGS[@]}" "${DATA_ARGS[@]}"
           "${RUN_ARGS[@]}" "$@")

source "${REPO_DIR}/examples/lib/launch_common.sh"
