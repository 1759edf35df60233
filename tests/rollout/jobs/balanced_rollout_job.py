"""torchrun job: 2 colocated ranks, engine_tp=1, so two real SGLang engines; each rank owns one.

Usage: torchrun --nproc-per-node 2 balanced_rollout_job.py MODEL_DIR OUTPUT_DIR
Both ranks generate the same step twice through RolloutWorker.generate(balance=True): first with
rollout.balance=partition, then with balance=steal while engine 1 is slowed by the fault hook
(DISTFLOW_FAULT_SLOW_CLAIMS), so engine 0 takes engine 1's chunks. Then engine 1 dies: its scheduler is
SIGKILLed while it generates its first claimed chunk (rollout.engine_restarts=1), engine 0 adopts what it
left, and engine 1 restarts; after it the same step is generated once more with both engines (the restarted
one serves model.path's weights, which here are the current ones). Every rank prints 'BALANCE {json}' with
its batches (ids, groups, tokens, logprobs, infos), the steal run's stats and its engine restarts.
"""

import datetime
import json
import os
import signal
import sys

import torch.distributed as dist

from distflow.config import resolve
from distflow.data.prompts import Prompt
from distflow.layout.placement import Placement
from distflow.workers.rollout import work_stealing
from distflow.workers.rollout.engine_state import state_of
from distflow.workers.rollout.worker import RolloutWorker

PROMPTS_PER_RANK, N, MAX_NEW_TOKENS = 4, 2, 6


def batch_summary(batch) -> dict:
    infos = batch.infos
    rows = [batch.sample(i) for i in range(len(batch))]
    return {
        "ids": batch.sample_ids.tolist(),
        "groups": batch.groups.tolist(),
        "tokens": [r["input_ids"].tolist() for r in rows],
        "logprobs": [r["rollout_logprobs"].tolist() for r in rows],
        "responses": [infos[i].response_ids for i in batch.sample_ids.tolist()],
        "ground_truth": [infos[i].ground_truth for i in batch.sample_ids.tolist()],
    }


def main():
    model_dir, output_dir = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    cfg = resolve(
        None,
        [
            f"model.path={model_dir}",
            f"trainer.output_dir={output_dir}",
            "rollout.engine_tp=1",
            f"rollout.n={N}",
            f"rollout.max_new_tokens={MAX_NEW_TOKENS}",
            "rollout.temperature=1.0",
            "rollout.balance_chunk_prompts=1",
            "rollout.balance_timeout_s=600",
            "rollout.engine_restarts=1",
        ],
        check_passthrough=False,
    )
    placement = Placement.create("colocated", 2, 1)
    worker = RolloutWorker(cfg, placement, rank, model_dir)
    # Distinct prompts per rank (rank r: token ids 10 + r * 40 + ...), of different lengths.
    prompts = [
        Prompt(
            index=rank * 100 + k,
            input_ids=[10 + rank * 40 + k + j for j in range(3 + k)],
            messages=[],
            data_source="test",
            ground_truth=f"{rank}/{k}",
        )
        for k in range(PROMPTS_PER_RANK)
    ]
    step, eos = 3, 1
    dist.barrier()
    cfg.rollout.balance = "partition"
    partition = batch_summary(worker.generate(prompts, eos, step=step, balance=True))
    partition_stats = worker.balance_stats
    dist.barrier()
    cfg.rollout.balance = "steal"
    os.environ[work_stealing.SLOW_CLAIMS_ENV] = (
        "1:300"  # engine 1 waits until engine 0 has claimed everything
    )
    steal = batch_summary(worker.generate(prompts, eos, step=step, balance=True))
    steal_stats = worker.balance_stats
    del os.environ[work_stealing.SLOW_CLAIMS_ENV]
    dist.barrier()
    claim = work_stealing.StoreBoard.claim
    if rank == 1:  # engine 1 dies while it generates its first claimed chunk

        def claim_then_die(board):
            claimed = claim(board)
            if claimed is not None and worker.restarts.count == 0 and not hasattr(board, "struck"):
                board.struck = True
                for pid in worker.engine.get_all_child_pids():
                    os.kill(pid, signal.SIGKILL)
            return claimed

        work_stealing.StoreBoard.claim = claim_then_die
    died = batch_summary(worker.generate(prompts, eos, step=step, balance=True))
    work_stealing.StoreBoard.claim = claim
    dist.barrier()
    if worker.engine is not None and not state_of(worker.engine).fresh:
        state_of(worker.engine).complete_update(None)  # model.path's weights are this job's current ones
    after = batch_summary(worker.generate(prompts, eos, step=step, balance=True))
    dist.barrier()
    worker.close()
    print(
        "BALANCE "
        + json.dumps(
            {
                "rank": rank,
                "partition": partition,
                "steal": steal,
                "partition_stats": partition_stats,
                "steal_stats": steal_stats,
                "died": died,
                "after_restart": after,
                "engine_restarts": worker.restarts.count,
            }
        ),
        flush=True,
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
