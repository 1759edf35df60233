#!/usr/bin/env bash
# GRPO on Qwen2.5-0.5B-Instruct with GSM8K, one GPU (24-80 GB): the GPU trains (Megatron TP 1) and hosts one
# SGLang engine (colocated; the engine frees its memory while Megatron trains). The small first run on a GPU:
# it prepares GSM8K itself, then trains 2 epochs with a rule-based reward (gsm8k: the number after "####").
#
#   MODEL_PATH=/models/Qwen2.5-0.5B-Instruct bash examples/grpo_qwen2.5_0.5b_1gpu.sh [section.key=value ...]
#   DRY_RUN=1 bash examples/grpo_qwen2.5_0.5b_1gpu.sh     # plan only: placement, memory, data and sync; no GPU
#   DRY_RUN=1 GPU_MEMORY_GB=24 bash examples/grpo_qwen2.5_0.5b_1gpu.sh   # the plan on a 24 GB card
# Data: DATA_DIR/{train,test}.parquet are written on the first run from GSM8K_INPUT (a folder with GSM8K's
# train.jsonl and test.jsonl, or a datasets.save_to_disk folder) or, without it, from the hub (openai/gsm8k).
set -euo pipefail

# ---- cluster: one node, one GPU ----
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
GPUS_PER_NODE=${GPUS_PER_NODE:-1}
GPU_MEMORY_GB=${GPU_MEMORY_GB:-80}          # for the dry run's memory check (24: RTX 4090/A10; 80: A100/H100)
BANDWIDTH_GBPS=${BANDWIDTH_GBPS:-400}       # for the dry run's weight-sync estimate (a local copy here)
WORLD_SIZE=$((NNODES * GPUS_PER_NODE))

# ---- paths and run names ----
REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODEL_PATH=${MODEL_PATH:-/models/Qwen2.5-0.5B-Instruct}      # HF checkpoint (config.json, safetensors, tokenizer)
SHIPPED_MODEL_CONFIG=${REPO_DIR}/examples/model_configs/qwen2.5-0.5b-instruct.json  # dry run without the checkpoint
DATA_DIR=${DATA_DIR:-${HOME}/data/gsm8k}                      # train.parquet / test.parquet (written if absent)
GSM8K_INPUT=${GSM8K_INPUT:-}                                  # your GSM8K copy (see the header)
TRAIN_FILES=${TRAIN_FILES:-${DATA_DIR}/train.parquet}   # data_source openai/gsm8k
VAL_FILES=${VAL_FILES:-${DATA_DIR}/test.parquet}       # data_source openai/gsm8k
CKPT_DIR=${CKPT_DIR:-${REPO_DIR}/outputs/grpo_qwen2.5_0.5b_1gpu}  # checkpoints, metrics, exported HF model
WANDB_PROJECT=${WANDB_PROJECT:-distflow}
WANDB_RUN=${WANDB_RUN:-grpo_qwen2.5_0.5b_1gpu}
PYTHON=${PYTHON:-python}
CONFIG=${REPO_DIR}/examples/configs/gpu_base.yaml

# ---- data: GSM8K in the RL parquet schema (data_source openai/gsm8k -> the gsm8k scorer) ----
prepare_gsm8k() { (cd "${REPO_DIR}" && "${PYTHON}" tools/prepare_data.py gsm8k --input "$1" --out "${DATA_DIR}"); }
if [[ "${DRY_RUN:-0}" != 1 && ! -f "${TRAIN_FILES}" ]]; then
    if [[ -z "${GSM8K_INPUT}" ]]; then                       # no local copy: fetch it from the hub once
        GSM8K_INPUT=${DATA_DIR}/raw
        "${PYTHON}" -c "import datasets, sys; datasets.load_dataset('openai/gsm8k', 'main').save_to_disk(sys.argv[1])" \
            "${GSM8K_INPUT}"
    fi
    if [[ -f "${GSM8K_INPUT}/train.jsonl" ]]; then           # github.com/openai/grade-school-math's data folder
        prepare_gsm8k "${GSM8K_INPUT}/train.jsonl"
        prepare_gsm8k "${GSM8K_INPUT}/test.jsonl"
    else                                                     # a datasets.save_to_disk folder (train + test)
        prepare_gsm8k "${GSM8K_INPUT}"
    fi
fi

MODEL_ARGS=(
    model.path="${MODEL_PATH}"
)
ACTOR_ARGS=(
    actor.tp=1 actor.pp=1                        # 0.5 B params: about 9 GiB of weights, grads and Adam states
    actor.max_tokens_per_micro_batch=8192        # token budget of one packed micro-batch (logits: 150k vocab)
    actor.recompute_granularity=full             # keep only each layer's input; recompute in backward
    actor.recompute_method=uniform
    actor.recompute_num_layers=1
    actor.mini_batch_size=32                     # prompts per optimizer step: 2 updates per RL step
    actor.optim.lr=1.0e-6
)
REF_ARGS=(
    ref.max_tokens_per_micro_batch=16384         # frozen reference for the KL term, in the actor's layout
)
ROLLOUT_ARGS=(
    rollout.placement=colocated
    rollout.engine_tp=1                          # one engine on the GPU
    rollout.n=8                                  # responses per prompt (the GRPO group)
    rollout.max_new_tokens=1024
    rollout.temperature=1.0
    rollout.mem_fraction_static=0.5              # of the memory free when the engine starts; lower it on OOM
)
ALGO_ARGS=(
    dag.pipeline=grpo
    algorithm.adv_estimator=grpo
    algorithm.kl_coef=0.001 algorithm.kl_estimator=k3   # KL loss against the reference (low-variance k3)
    algorithm.entropy_coef=0
    algorithm.loss_agg_mode=token-mean
)
DATA_ARGS=(
    data.train_files="[${TRAIN_FILES}]"
    data.val_files="[${VAL_FILES}]"
    data.max_prompt_length=512
    data.train_batch_size=64                     # prompts per RL step: 512 samples; 116 steps per GSM8K epoch
    data.val_batch_size=512
    reward.name=auto                             # rule-based scorer chosen by each sample's data_source
)
RUN_ARGS=(
    trainer.total_steps=232
    trainer.val_every=20
    trainer.output_dir="${CKPT_DIR}"
    checkpoint.save_every=50
    checkpoint.resume=auto
    tracking.project="${WANDB_PROJECT}"
    tracking.run_name="${WANDB_RUN}"
)
OVERRIDES=("${MODEL_ARGS[@]}" "${ACTOR_ARGS[@]}" "${REF_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${ALGO_ARGS[@]}"
           "${DATA_ARGS[@]}" "${RUN_ARGS[@]}" "$@")

source "${REPO_DIR}/examples/lib/launch_common.sh"
