#!/usr/bin/env bash
# Runs a DistFlow launch script (examples/*.sh) on every node of a SLURM allocation: srun starts one task
# per node, each runs SCRIPT with the rendezvous taken from SLURM, and the script's torchrun starts one
# process per GPU. Submit from the repository root:
#
#   sbatch --nodes 8 examples/slurm/sbatch_distflow.sh examples/grpo_qwen2.5_72b_8nodes.sh [section.key=value ...]
#   MODEL_PATH=/models/Qwen2.5-72B CKPT_DIR=/shared/ckpt/72b sbatch --nodes 8 examples/slurm/sbatch_distflow.sh ...
#
# sbatch exports the submitting shell's environment (MODEL_PATH, TRAIN_FILES, CKPT_DIR, WANDB_*, ...) to
# every node. The scripts set checkpoint.resume=auto, so every start of the job resumes from its last
# complete checkpoint. Within the allocation torchrun restarts a job that lost a rank (MAX_RESTARTS, 2);
# beyond that this wrapper requeues the job itself:
#   - when the time limit nears (SLURM signals the batch shell 5 minutes before: --signal): the ranks get
#     SIGTERM and stop, and the job goes back to the queue; always (a long run spans many allocations);
#   - when the run fails (torchrun's restarts spent, a node lost): while SLURM's requeue count of the job
#     is below MAX_REQUEUES (3), so a run that cannot succeed does not loop forever.
# trainer/restarts in the metrics counts torchrun restarts plus SLURM requeues.
#SBATCH --job-name=distflow
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#SBATCH --open-mode=append
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

MAX_REQUEUES=${MAX_REQUEUES:-3}
REQUEUES=${SLURM_RESTART_COUNT:-0}

echo "distflow: ${SCRIPT} on ${NNODES} node(s) x ${GPUS_PER_NODE} GPUs, rendezvous ${MASTER_ADDR}:${MASTER_PORT}" \
    "(requeues so far: ${REQUEUES})"
TIME_LIMIT_NEAR=0
on_time_limit() {
    TIME_LIMIT_NEAR=1
    echo "distflow: the time limit is near: stopping the ranks (SIGTERM) to requeue the job"
    kill -TERM "${SRUN_PID}" 2>/dev/null || true
}
trap on_time_limit USR1

# One task per node; NODE_RANK is the task's node index within the allocation. In the background, so that
# the shell can take SLURM's signal while it waits.
srun --nodes="${NNODES}" --ntasks-per-node=1 --kill-on-bad-exit=1 \
    bash -c 'NODE_RANK=${SLURM_NODEID} exec bash "$0" "$@"' "${SCRIPT}" "$@" &
SRUN_PID=$!
rc=0
wait "${SRUN_PID}" || rc=$?
while kill -0 "${SRUN_PID}" 2>/dev/null; do  # a trapped signal ends `wait` early: wait again for srun
    rc=0
    wait "${SRUN_PID}" || rc=$?
done

requeue() {
    echo "distflow: $1: requeueing job ${SLURM_JOB_ID}; its next start resumes from the last complete checkpoint"
    scontrol requeue "${SLURM_JOB_ID}"
}
if ((TIME_LIMIT_NEAR)); then
    requeue "stopped before the time limit"
elif ((rc != 0)); then
    if ((REQUEUES < MAX_REQUEUES)); then
        requeue "the run failed (exit code ${rc}; requeue $((REQUEUES + 1)) of MAX_REQUEUES=${MAX_REQUEUES})"
    else
        echo "distflow: the run failed (exit code ${rc}); not requeued: ${REQUEUES} requeue(s) already" \
            "(MAX_REQUEUES=${MAX_REQUEUES}); resubmit to resume from the last complete checkpoint"
    fi
fi
exit "${rc}"
