#!/usr/bin/env bash
# GRPO on Qwen3-30B-A3B (MoE: 128 experts, top-8), 2 nodes x 8 GPUs, colocated. Training: attention and
# embeddings Megatron TP 4 x DP 4; the experts expert-parallel over EP 8 (16 experts per GPU, whole experts:
# ETP 1) x expert-DP 2. Rollout: 4 SGLang engines of TP 4.
#
#   NNODES=2 NODE_RANK=<0|1> MASTER_ADDR=<node 0> MODEL_PATH=/models/Qwen3-30B-A3B \
#       bash examples/grpo_qwen3_30b_a3b_2nodes.sh [section.key=value ...]    # on every node
#   sbatch --nodes 2 examples/slurm/sbatch_distflow.sh examples/grpo_qwen3_30b_a3b_2nodes.sh
#   DRY_RUN=1 bash examples/grpo_qwen3_30b_a3b_2nodes.sh   # plan only, on any machine
# Data: DAPO's own parquet files, already in the RL schema, each prompt asking for a last line "Answer: ...",
# data_source math_dapo (scored by reward.name=auto with DAPO's rule, +1 / -1: distflow/rewards/math_dapo.py):
#   huggingface-cli download --repo-type dataset BytedTsinghua-SIA/DAPO-Math-17k --local-dir /data/dapo-math-17k
#   huggingface-cli download --repo-type dataset BytedTsinghua-SIA/AIME-2024 --local-dir /data/aime-2024
set -euo pipefail

# ---- cluster: torchrun's rendezvous (SLURM: examples/slurm/sbatch_distflow.sh sets these) ----
NNODES=${NNODES:-2}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
GPU_MEMORY_GB=${GPU_MEMORY_GB:-80}          # for the dry run's memory check (80: H100/A100 80GB)
BANDWIDTH_GBPS=${BANDWIDTH_GBPS:-400}       # per-GPU link, for the dry run's weight-sync estimate
WORLD_SIZE=$((NNODES * GPUS_PER_NODE))

# ---- paths and run names ----
REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODEL_PATH=${MODEL_PATH:-/models/Qwen3-30B-A3B}
SHIPPED_MODEL_CONFIG=${REPO_DIR}/examples/model_configs/qwen3-30b-a3b.json
TRAIN_FILES=${TRAIN_FILES:-/data/dapo-math-17k/data/dapo-math-17k.parquet}   # data_source math_dapo
VAL_FILES=${VAL_FILES:-/data/aime-2024/data/aime-2024.parquet}                # data_source math_dapo
CKPT_DIR=${CKPT_DIR:-/checkpoints/grpo_qwen3_30b_a3b_2nodes} # on a file system every node sees
WANDB_PROJECT=${WANDB_PROJECT:-distflow}
WANDB_RUN=${WANDB_RUN:-grpo_qwen3_30b_a3b_2nodes}
PYTHON=${PYTHON:-python}
CONFIG=${REPO_DIR}/examples/configs/gpu_base.yaml

MODEL_ARGS=(
    model.path="${MODEL_PATH}"
)
ACTOR_ARGS=(
    actor.tp=4 actor.pp=1                        # dense part (attention, embeddings): TP 4, DP 4
    actor.ep=8 actor.etp=1                       # experts: 128 / 8 = 16 whole experts per GPU
    actor.sequence_parallel=true
    actor.max_tokens_per_micro_batch=16384
    actor.recompute_granularity=full actor.recompute_method=uniform actor.recompute_num_layers=1
    actor.mini_batch_size=64                     # 4 updates per RL step
    actor.optim.lr=1.0e-6
)
ROLLOUT_ARGS=(
    rollout.placement=colocated
    rollout.engine_tp=4                          # 4 engines; 14 GiB of weights per GPU
    rollout.n=8
    rollout.max_new_tokens=8192
    rollout.mem_fraction_static=0.85
)
ALGO_ARGS=(
    dag.pipeline=grpo
    algorithm.adv_estimator=grpo
    algorithm.clip_ratio_low=0.2 algorithm.clip_ratio_high=0.28
    algorithm.kl_coef=0.0 ref.enable=false       # no KL term: no reference model to hold
    algorithm.loss_agg_mode=token-mean
)
DATA_ARGS=(
    data.train_files="[${TRAIN_FILES}]"
    data.val_files="[${VAL_FILES}]"
    data.max_prompt_length=1024
    data.train_batch_size=256
    reward.name=auto
)
RUN_ARGS=(
    trainer.total_steps=300
    trainer.output_dir="${CKPT_DIR}"
    checkpoint.save_every=20
    checkpoint.resume=auto
    tracking.project="${WANDB_PROJECT}"
    tracking.run_name="${WANDB_RUN}"
)
OVERRIDES=("${MODEL_ARGS[@]}" "${ACTOR_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${ALGO_ARGS[@]}" "${DATA_ARGS[@]}"
           "${RUN_ARGS[@]}" "$@")

source "${REPO_DIR}/examples/lib/launch_common.sh"
