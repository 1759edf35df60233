#!/usr/bin/env bash
# PPO with a critic (GAE) on Llama-3.1-70B, 16 nodes x 8 GPUs, colocated: actor, critic and reference each
# Megatron TP 8 (inside a node) x PP 4 x DP 4 on all 128 GPUs, 16 SGLang engines of TP 8 (one per node).
# The KL to the reference is a reward penalty, as in classic RLHF PPO.
#
#   NNODES=16 NODE_RANK=<0..15> MASTER_ADDR=<node 0> MODEL_PATH=/models/Llama-3.1-70B-Instruct \
#       bash examples/ppo_llama3.1_70b_16nodes.sh [section.key=value ...]     # on every node
#   sbatch --nodes 16 examples/slurm/sbatch_distflow.sh examples/ppo_llama3.1_70b_16nodes.sh
#   DRY_RUN=1 bash examples/ppo_llama3.1_70b_16nodes.sh    # plan only, on any machine
# Data: GSM8K in the RL schema, data_source openai/gsm8k (reward.name=auto: the "#### <number>" answer; for
# numbers comparable with verl's GSM8K baselines add reward.name=gsm8k_verl), from your copy of GSM8K:
#   python tools/prepare_data.py gsm8k --input gsm8k/train.jsonl --out /data/gsm8k    # and test.jsonl
set -euo pipefail

# ---- cluster: torchrun's rendezvous (SLURM: examples/slurm/sbatch_distflow.sh sets these) ----
NNODES=${NNODES:-16}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
GPU_MEMORY_GB=${GPU_MEMORY_GB:-80}          # for the dry run's memory check (80: H100/A100 80GB)
BANDWIDTH_GBPS=${BANDWIDTH_GBPS:-400}       # per-GPU link, for the dry run's weight-sync estimate
WORLD_SIZE=$((NNODES * GPUS_PER_NODE))

# ---- paths and run names ----
REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODEL_PATH=${MODEL_PATH:-/models/Llama-3.1-70B-Instruct}
CRITIC_PATH=${CRITIC_PATH:-${MODEL_PATH}}                    # HF checkpoint the critic starts from
SHIPPED_MODEL_CONFIG=${REPO_DIR}/examples/model_configs/llama3.1-70b.json
TRAIN_FILES=${TRAIN_FILES:-/data/gsm8k/train.parquet}       # data_source openai/gsm8k
VAL_FILES=${VAL_FILES:-/data/gsm8k/test.parquet}           # data_source openai/gsm8k
CKPT_DIR=${CKPT_DIR:-/checkpoints/ppo_llama3.1_70b_16nodes}  # on a file system every node sees
WANDB_PROJECT=${WANDB_PROJECT:-distflow}
WANDB_RUN=${WANDB_RUN:-ppo_llama3.1_70b_16nodes}
PYTHON=${PYTHON:-python}
CONFIG=${REPO_DIR}/examples/configs/gpu_base.yaml

MODEL_ARGS=(
    model.path="${MODEL_PATH}"
)
ACTOR_ARGS=(
    actor.tp=8 actor.pp=4                        # 70.6 B params: 2.2 B per GPU; DP 4
    actor.sequence_parallel=true
    actor.max_tokens_per_micro_batch=8192
    actor.recompute_granularity=full actor.recompute_method=uniform actor.recompute_num_layers=1
    actor.mini_batch_size=256                    # 4 actor updates per RL step
    actor.optim.lr=1.0e-6
)
CRITIC_ARGS=(
    critic.enable=true critic.path="${CRITIC_PATH}"  # in the actor's layout: a second 70 B model's states on every GPU
    critic.sequence_parallel=true
    critic.max_tokens_per_micro_batch=8192
    critic.recompute_granularity=full critic.recompute_method=uniform critic.recompute_num_layers=1
    critic.mini_batch_size=256
    critic.optim.lr=1.0e-5 critic.optim.lr_warmup_steps=10
)
REF_ARGS=(
    ref.max_tokens_per_micro_batch=16384         # the reference runs in the actor's layout
)
ROLLOUT_ARGS=(
    rollout.placement=colocated
    rollout.engine_tp=8                          # one engine per node
    rollout.n=1                                  # PPO: one response per prompt, the critic is the baseline
    rollout.max_new_tokens=2048
    rollout.mem_fraction_static=0.85
)
ALGO_ARGS=(
    dag.pipeline=ppo
    algorithm.adv_estimator=gae algorithm.gamma=1.0 algorithm.lam=1.0
    algorithm.clip_ratio_low=0.2 algorithm.clip_ratio_high=0.2
    algorithm.value_clip=0.5
    algorithm.kl_coef=0.001 algorithm.kl_in_reward=true algorithm.kl_estimator=k1
    algorithm.loss_agg_mode=token-mean
)
DATA_ARGS=(
    data.train_files="[${TRAIN_FILES}]"
    data.val_files="[${VAL_FILES}]"
    data.max_prompt_length=1024
    data.train_batch_size=1024
    reward.name=auto
)
RUN_ARGS=(
    trainer.total_steps=200
    trainer.output_dir="${CKPT_DIR}"
    checkpoint.save_every=10
    checkpoint.resume=auto
    tracking.project="${WANDB_PROJECT}"
    tracking.run_name="${WANDB_RUN}"
)
OVERRIDES=("${MODEL_ARGS[@]}" "${ACTOR_ARGS[@]}" "${CRITIC_ARGS[@]}" "${REF_ARGS[@]}" "${ROLLOUT_ARGS[@]}"
           "${ALGO_ARGS[@]}" "${DATA_ARGS[@]}" "${RUN_ARGS[@]}" "$@")

source "${REPO_DIR}/examples/lib/launch_common.sh"
