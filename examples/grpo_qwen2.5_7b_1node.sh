#!/usr/bin/env bash
# GRPO on Qwen2.5-7B, one node of 8 GPUs, colocated: every GPU trains (Megatron TP 2 x DP 4) and hosts a
# share of an SGLang engine (4 engines of TP 2). Math RL with a rule-based reward, small KL to the reference.
#
#   MODEL_PATH=/models/Qwen2.5-7B TRAIN_FILES=/data/math/train.parquet VAL_FILES=/data/math/test.parquet \
#       bash examples/grpo_qwen2.5_7b_1node.sh [section.key=value ...]
#   DRY_RUN=1 bash examples/grpo_qwen2.5_7b_1node.sh     # plan only: placement, memory, data and sync; no GPU
# Multi-node: set NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT on every node (or use examples/slurm/).
# Data: MATH in the RL schema, data_source DigitalLearningGmbH/MATH-lighteval (reward.name=auto: boxed answer,
# math-verify), e.g. from your copy of the MATH train and test jsonl files:
#   python tools/prepare_data.py math --input math_train.jsonl --split train --out /data/math
#   python tools/prepare_data.py math --input math_test.jsonl --split test --out /data/math
set -euo pipefail

# ---- cluster: torchrun's rendezvous (SLURM: examples/slurm/sbatch_distflow.sh sets these) ----
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
GPU_MEMORY_GB=${GPU_MEMORY_GB:-80}          # for the dry run's memory check (80: H100/A100 80GB)
BANDWIDTH_GBPS=${BANDWIDTH_GBPS:-400}       # per-GPU link, for the dry run's weight-sync estimate
WORLD_SIZE=$((NNODES * GPUS_PER_NODE))

# ---- paths and run names ----
REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODEL_PATH=${MODEL_PATH:-/models/Qwen2.5-7B}                  # HF checkpoint (config.json, safetensors, tokenizer)
SHIPPED_MODEL_CONFIG=${REPO_DIR}/examples/model_configs/qwen2.5-7b.json  # dry run without the checkpoint
TRAIN_FILES=${TRAIN_FILES:-/data/math/train.parquet}         # data_source DigitalLearningGmbH/MATH-lighteval
VAL_FILES=${VAL_FILES:-/data/math/test.parquet}            # data_source DigitalLearningGmbH/MATH-lighteval
CKPT_DIR=${CKPT_DIR:-/checkpoints/grpo_qwen2.5_7b_1node}     # checkpoints, metrics, exported HF model
WANDB_PROJECT=${WANDB_PROJECT:-distflow}
WANDB_RUN=${WANDB_RUN:-grpo_qwen2.5_7b_1node}
PYTHON=${PYTHON:-python}
CONFIG=${REPO_DIR}/examples/configs/gpu_base.yaml

MODEL_ARGS=(
    model.path="${MODEL_PATH}"
)
ACTOR_ARGS=(
    actor.tp=2 actor.pp=1                        # 7.6 B params: 3.8 B per GPU, DP 4 over the node
    actor.sequence_parallel=true
    actor.max_tokens_per_micro_batch=16384       # token budget of one packed micro-batch
    actor.recompute_granularity=full             # keep only each layer's input; recompute in backward
    actor.recompute_method=uniform
    actor.recompute_num_layers=1
    actor.mini_batch_size=128                    # prompts per optimizer step: 2 updates per RL step
    actor.optim.lr=1.0e-6
)
REF_ARGS=(
    ref.max_tokens_per_micro_batch=32768         # frozen reference for the KL term, in the actor's layout
)
ROLLOUT_ARGS=(
    rollout.placement=colocated
    rollout.engine_tp=2                          # 4 engines of 2 GPUs
    rollout.n=8                                  # responses per prompt (the GRPO group)
    rollout.max_new_tokens=3072
    rollout.temperature=1.0
    rollout.mem_fraction_static=0.85             # of the memory free when the engine starts
)
ALGO_ARGS=(
    dag.pipeline=grpo
    algorithm.adv_estimator=grpo
    algorithm.clip_ratio_low=0.2 algorithm.clip_ratio_high=0.28
    algorithm.kl_coef=0.001 algorithm.kl_estimator=k3   # KL loss against the reference (low-variance k3)
    algorithm.entropy_coef=0
    algorithm.loss_agg_mode=token-mean
)
DATA_ARGS=(
    data.train_files="[${TRAIN_FILES}]"
    data.val_files="[${VAL_FILES}]"
    data.max_prompt_length=1024
    data.train_batch_size=256                    # prompts per RL step: 2048 samples
    reward.name=auto                             # rule-based scorer chosen by each sample's data_source
)
RUN_ARGS=(
    trainer.total_steps=500
    trainer.val_every=10
    trainer.output_dir="${CKPT_DIR}"
    checkpoint.save_every=20
    checkpoint.resume=auto
    tracking.project="${WANDB_PROJECT}"
    tracking.run_name="${WANDB_RUN}"
)
OVERRIDES=("${MODEL_ARGS[@]}" "${ACTOR_ARGS[@]}" "${REF_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${ALGO_ARGS[@]}"
           "${DATA_ARGS[@]}" "${RUN_ARGS[@]}" "$@")

source "${REPO_DIR}/examples/lib/launch_common.sh"
