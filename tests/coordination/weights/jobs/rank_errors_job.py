"""2-rank gloo job for RankErrors (test_weight_rank_errors.py): each case runs the same phases on both
ranks, some of which fail on some ranks, and prints one `RANK-ERRORS {json}` line per rank and case: what it
gathered or raised, which phases ran, how many all_gather_object calls it made, and what on_failure saw."""

import datetime
import json

import torch.distributed as dist

from distflow.coordination.weights.rank_errors import RankErrors, WeightSyncError

CASES = {  # case -> {phase: ranks that fail in it}
    "none": {},
    "rank1_phase0": {0: [1]},
    "both_phase1": {1: [0, 1]},
    "rank0_phase0_rank1_phase1": {0: [0], 1: [1]},
}


def run_case(name: str, failing: dict, rank: int) -> dict:
    calls, ran, aborted = [0], [], []
    gather = dist.all_gather_object

    def counted(*args, **kwargs):
        calls[0] += 1
        return gather(*args, **kwargs)

    def phase(i):
        ran.append(i)
        if rank in failing.get(i, []):
            raise ValueError(f"phase {i} broke on rank {rank}")
        return {"phase": i, "rank": rank}

    errors = RankErrors("weight sync to version 7", on_failure=aborted.append)
    dist.all_gather_object = counted
    result = {"case": name, "rank": rank}
    try:
        # Two phases before the first exchange (a failure in the first must skip the second on that rank),
        # then a third after it (reached only if nobody failed).
        first = errors.run(phase, 0, default="skipped")
        second = errors.run(phase, 1, default="skipped")
        result["gathered"] = errors.exchange([first, second])
        result["after"] = errors.exchange(errors.run(phase, 2))
    except WeightSyncError as error:
        result["raised"] = str(error)
    finally:
        dist.all_gather_object = gather
    result.update(ran=ran, all_gathers=calls[0], aborted=aborted)
    return result


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    for name, failing in CASES.items():
        print("RANK-ERRORS " + json.dumps(run_case(name, failing, rank)), flush=True)
    dist.barrier()  # every rank is still in step after the failed exchanges
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
