"""torchrun job: rank 0 of a 2-rank gloo world owns an SGLang engine; both ranks meet at barriers around it.

Usage: torchrun --nproc-per-node 2 engine_in_torchrun.py MODEL_DIR PROMPT_JSON MAX_NEW_TOKENS
Rank 0 prints 'ENGINE-OK {"tokens": [...], "logprobs": [...]}' (greedy, for PROMPT_JSON); every rank prints
'RANK-DONE r'. Without the launch environment's fixes the engine's schedulers hang in torchrun's store.
"""

import datetime
import json
import sys

import torch.distributed as dist

from distflow.workers.rollout import generate, shutdown_engine, start_engine


def main():
    model_dir, prompt, max_new_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    # Rank 1 waits at the barrier while rank 0 starts the engine (15 s idle, minutes on a loaded machine).
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    engine = start_engine(model_dir, startup_timeout_s=480) if rank == 0 else None
    dist.barrier()
    if rank == 0:
        (sample,) = generate(engine, [prompt], temperature=0.0, max_new_tokens=max_new_tokens)
        print(
            "ENGINE-OK " + json.dumps({"tokens": sample.response_ids, "logprobs": sample.logprobs}),
            flush=True,
        )
        shutdown_engine(engine)
    dist.barrier()  # the gloo group still works after the engine came and went
    print(f"RANK-DONE {rank}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
