#!/usr/bin/env bash
# Runs a DistFlow launch script (examples/*.sh) on every node of a SLURM allocation: srun starts one task
# per node, each runs SCRIPT with the rendezvous taken from SLURM, and the script's torchrun starts one
# process per GPU. Submit from the repository root:
#
#   sbatch --nodes 8 examples/slurm/sbatch_distflow.sh examples/grpo_qwen2.5_72b_8nodes.sh [section.key=value ...]
#   MODEL_PATH=/models/Qwen2.5-72B CKPT_DIR=/shared/ckpt/72b sbatch --nodes 8 examples/slurm/sbatch_distflow.sh ...
#
# sbatch exports the submitting shell's environment (MODEL_PATH, TRAIN_FILES, CKPT_DIR, WANDB_*, ...) to
# every node. Requeue or resubmit the same command to resume: the scripts set checkpoint.resume=auto.
#SBATCH --job-name=distflow
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --output=distflow-%x-%j.out
set -euo pipefail

SCRIPT=${1:?usage: sbatch --nodes N examples/slurm/sbatch_distflow.sh SCRIPT [section.key=value ...]}
shift

NNODES=${SLURM_NNODES:?run this under sbatch or salloc (SLURM_NNODES is not set)}
mapfile -t HOSTS < <(scontrol show hostnames "${SLURM_JOB_NODELIST}")   # (no `| head`: SIGPIPE under pipefail)
MASTER_ADDR=${MASTER_ADDR:-${HOSTS[0]}}                                  # the allocation's first node
MASTER_PORT=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}   # a per-job port: jobs sharing a node do not clash
GPUS_PER_NODE=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-8}}
export NNODES MASTER_ADDR MASTER_PORT GPUS_PER_NODE

echo "distflow: ${SCRIPT} on ${NNODES} node(s) x ${GPUS_PER_NODE} GPUs, rendezvous ${MASTER_ADDR}:${MASTER_PORT}"
# One task per node; NODE_RANK is the task's node index within the allocation.
srun --nodes="${NNODES}" --ntasks-per-node=1 --kill-on-bad-exit=1 \
    bash -c 'NODE_RANK=${SLURM_NODEID} exec bash "$0" "$@"' "${SCRIPT}" "$@"
