#!/usr/bin/env bash
# GRPO on Qwen2.5-7B, disaggregated: node 0 trains (Megatron TP 2 x DP 4 on ranks 0-7), node 1 only
# generates (8 SGLang engines of TP 1 on ranks 8-15); the new weights travel to the engines over NCCL.
# Engines keep their memory across steps (nothing to release) and may use most of the GPU for KV cache.
#
#   NNODES=2 NODE_RANK=<0|1> MASTER_ADDR=<node 0> MODEL_PATH=/models/Qwen2.5-7B \
#       bash examples/grpo_qwen2.5_7b_disaggregated.sh [section.key=value ...]  # on both nodes
#   sbatch --nodes 2 examples/slurm/sbatch_distflow.sh examples/grpo_qwen2.5_7b_disaggregated.sh
#   DRY_RUN=1 bash examples/grpo_qwen2.5_7b_disaggregated.sh      # plan only, on any machine
# Status: the dry run plans this layout; distflow.train does not yet build Megatron's process groups on a
# subset of the ranks (distflow/distributed/process_groups.py), so a real run stops there with a LayoutError.
# Data: MATH in the RL schema, data_source DigitalLearningGmbH/MATH-lighteval (reward.name=auto: boxed answer,
# math-verify), e.g. from your copy of the MATH train and test jsonl files:
#   python tools/prepare_data.py math --input math_train.jsonl --split train --out /data/math
#   python tools/prepare_data.py math --input math_test.jsonl --split test --out /data/math
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
ROLLOUT_NODES=${ROLLOUT_NODES:-1}           # the last ROLLOUT_NODES nodes host engines only

# ---- paths and run names ----
REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODEL_PATH=${MODEL_PATH:-/models/Qwen2.5-7B}
SHIPPED_MODEL_CONFIG=${REPO_DIR}/examples/model_configs/qwen2.5-7b.json
TRAIN_FILES=${TRAIN_FILES:-/data/math/train.parquet}         # data_source DigitalLearningGmbH/MATH-lighteval
VAL_FILES=${VAL_FILES:-/data/math/test.parquet}            # data_source DigitalLearningGmbH/MATH-lighteval
CKPT_DIR=${CKPT_DIR:-/checkpoints/grpo_qwen2.5_7b_disaggregated}
WANDB_PROJECT=${WANDB_PROJECT:-distflow}
WANDB_RUN=${WANDB_RUN:-grpo_qwen2.5_7b_disaggregated}
PYTHON=${PYTHON:-python}
CONFIG=${REPO_DIR}/examples/configs/gpu_base.yaml

MODEL_ARGS=(
    model.path="${MODEL_PATH}"
)
ACTOR_ARGS=(
    actor.tp=2 actor.pp=1                        # on the training ranks only: DP = 8 / 2 = 4
    actor.sequence_parallel=true
    actor.max_tokens_per_micro_batch=16384
    actor.recompute_granularity=full actor.recompute_method=uniform actor.recompute_num_layers=1
    actor.mini_batch_size=128
    actor.optim.lr=1.0e-6
)
REF_ARGS=(
    ref.max_tokens_per_micro_batch=32768         # the reference runs in the actor's layout
)
ROLLOUT_ARGS=(
    rollout.placement=disaggregated
    rollout.num_ranks=$((ROLLOUT_NODES * GPUS_PER_NODE))   # the last ranks: engines only
    rollout.engine_tp=1                          # 7.6 B fits one GPU: 8 engines on the rollout node
    rollout.n=8
    rollout.max_new_tokens=3072
    rollout.mem_fraction_static=0.85
)
ALGO_ARGS=(
    dag.pipeline=grpo
    algorithm.adv_estimator=grpo
    algorithm.clip_ratio_low=0.2 algorithm.clip_ratio_high=0.28
    algorithm.kl_coef=0.001 algorithm.kl_estimator=k3
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
    trainer.total_steps=500
    trainer.output_dir="${CKPT_DIR}"
    checkpoint.save_every=20
    checkpoint.resume=auto
    tracking.project="${WANDB_PROJECT}"
    tracking.run_name="${WANDB_RUN}"
)
OVERRIDES=("${MODEL_ARGS[@]}" "${ACTOR_ARGS[@]}" "${REF_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${ALGO_ARGS[@]}"
           "${DATA_ARGS[@]}" "${RUN_ARGS[@]}" "$@")

source "${REPO_DIR}/examples/lib/launch_common.sh"
