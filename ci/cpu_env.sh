# Environment for running DistFlow on a small CPU machine (sourced by ci/*.sh).
# One OpenMP thread per process: 2-4 ranks on 2 cores are ~3x slower with oversubscribed threads.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# W&B never reaches the network from CI; runs are written offline.
export WANDB_MODE="${WANDB_MODE:-offline}"
export TOKENIZERS_PARALLELISM=false
