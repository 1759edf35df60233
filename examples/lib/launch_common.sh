# Shared tail of the example launch scripts: run the dry-run planner (DRY_RUN=1) or torchrun with the
# script's CONFIG and OVERRIDES. Sourced last by every examples/*.sh; it reads their variables.
cd "${REPO_DIR}"
if [[ "${DRY_RUN:-0}" == 1 ]]; then
    PLAN_ARGS=(--world-size "${WORLD_SIZE}" --gpus-per-node "${GPUS_PER_NODE}" --gpu-memory-gb "${GPU_MEMORY_GB}"
               --bandwidth-gbps "${BANDWIDTH_GBPS}")
    [[ -f "${MODEL_PATH}/config.json" ]] || PLAN_ARGS+=(--model-config "${SHIPPED_MODEL_CONFIG}")
    exec "${PYTHON}" -m distflow.plan "${CONFIG}" "${OVERRIDES[@]}" "${PLAN_ARGS[@]}"
fi

export CUDA_DEVICE_MAX_CONNECTIONS=1             # Megatron: keep TP/SP communication ordered with compute
# A rank that dies (OOM, a lost GPU, an engine crash) restarts the job, which resumes from its last complete
# checkpoint (checkpoint.resume=auto), up to MAX_RESTARTS times (docs/fault_tolerance.md).
exec torchrun --nnodes "${NNODES}" --node-rank "${NODE_RANK}" --master-addr "${MASTER_ADDR}" \
    --master-port "${MASTER_PORT}" --nproc-per-node "${GPUS_PER_NODE}" --max-restarts "${MAX_RESTARTS:-2}" \
    -m distflow.train "${CONFIG}" "${OVERRIDES[@]}"
