"""torchrun job: DAPO's collective dynamic-sampling decision (distflow.nodes.dynamic_sampling.collect_groups, the loop the
dynamic_sampling node runs) under the per-rank controller, with uneven kept counts per rank.

Every rank but the last holds samples (the last is like a non-owner TP rank of an engine: it only joins the
collective). Holder r generates GROUPS groups of N samples per round; the scores make exactly KEPT[r] groups
per round informative (differing scores), the others all-equal. Each rank writes what it kept, how many
rounds it drew and the counts, for the test to check.

--fail-rank R --fail-attempt A: rank R raises inside its draw of round A, while the other ranks wait in
that round's all_reduce; the failure signal must stop them with R's error.
--lose-rank R --lose-attempts A,B: rank R's rounds A and B come back lost (as after an engine death) the
first time; every rank resyncs and R draws each again (the same round), which must change nothing kept.
"""

import argparse
import datetime
import json
import time

import torch
import torch.distributed as dist

from distflow.coordination.data import PackedBatch
from distflow.dag import Pipeline
from distflow.dag.controller import RankController
from distflow.dag.failure import FailureSignal
from distflow.nodes.dynamic_sampling import Round, collect_groups

N, GROUPS = 2, 4
SCENARIOS = {  # kept groups per round for ranks 0, 1, 2 (rank 3 holds nothing); target; max attempts; unit
    "trim": dict(kept=[1, 3, 0], target=10, attempts=5, unit=1),  # 4/round -> round 3 has 12 -> trim to 10
    "partial": dict(kept=[1, 2, 0], target=100, attempts=2, unit=4),  # 6 kept -> 4 (a multiple of the unit)
    "none": dict(kept=[0, 0, 0], target=4, attempts=3, unit=1),  # nothing informative: skip the update
}


def make_round(rank: int, attempt: int, kept: int) -> Round:
    """Ids unique over ranks and rounds; groups [0, kept) of the round get scores 0/1, the rest 0/0."""
    ids, groups, tokens, scores = [], [], [], []
    for g in range(GROUPS):
        group = rank * 1_000_000 + attempt * 1000 + g
        for k in range(N):
            ids.append(group * 10 + k)
            groups.append(group)
            tokens.append(torch.full((3 + k,), g, dtype=torch.long))
            scores.append(float(k) if g < kept else 0.5)
    samples = PackedBatch.from_samples(ids, groups, {"input_ids": tokens})
    rewards = PackedBatch(
        samples.sample_ids, samples.groups, samples.lengths, {"rewards": torch.tensor(scores) * 2}
    )  # trained-on rewards differ from the scores
    return Round(samples, rewards, torch.tensor(scores))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", default="trim", choices=sorted(SCENARIOS))
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-attempt", type=int, default=2)
    parser.add_argument("--lose-rank", type=int, default=-1)
    parser.add_argument("--lose-attempts", default="")
    parser.add_argument("--out")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    sc = SCENARIOS[args.scenario]
    holds = rank < world - 1
    kept_per_round = sc["kept"][rank] if holds else 0
    failure = FailureSignal.from_default_group(poll_s=0.2).start()
    draws, resyncs, redraws = [], [], []
    to_lose = {int(a) for a in args.lose_attempts.split(",") if a} if rank == args.lose_rank else set()
    attempt_now = [1]

    def round_of(attempt):
        if attempt in to_lose:  # lost once: its redraw is the round itself
            to_lose.discard(attempt)
            return Round(lost=True)
        return make_round(rank, attempt, kept_per_round)

    def resync():
        resyncs.append(attempt_now[0])

    def redraw(lost):
        redraws.append([attempt_now[0], lost])
        return make_round(rank, attempt_now[0], kept_per_round) if lost else Round()

    def draw(attempt):
        draws.append(attempt)
        attempt_now[0] = attempt
        if rank == args.fail_rank and attempt == args.fail_attempt:
            time.sleep(0.5)  # the others are inside the all_reduce by now
            raise ValueError(f"deliberate failure in round {attempt}")
        if rank == 0:
            time.sleep(0.3)  # a slower engine: the others wait for it in the collective
        return round_of(attempt) if holds else Round()

    def dynamic_sampling(ctx, inputs):
        first = round_of(1) if holds else Round()
        result = collect_groups(
            first, draw, sc["target"], sc["attempts"], sc["unit"], resync=resync, redraw=redraw
        )
        return {"result": result}

    pipeline = Pipeline("dapo_test").add("dynamic_sampling", "all", dynamic_sampling, ["prompts"], ["result"])
    controller = RankController(pipeline, None, rank, {"all": tuple(range(world))}, failure=failure)
    result = controller.run_step({"prompts": None}).outputs["result"]
    mine = {
        "rank": rank,
        "draws": draws,
        "resyncs": resyncs,
        "redraws": redraws,
        "attempts": result.attempts,
        "kept_groups": result.kept_groups,
        "kept_before_trim": result.kept_before_trim,
        "dropped": result.dropped_groups,
        "generated": result.generated_groups,
        "partial": result.partial,
        "holds": result.samples is not None,
    }
    if result.samples is not None:
        mine.update(
            ids=result.samples.sample_ids.tolist(),
            groups=result.samples.groups.tolist(),
            reward_ids=result.rewards.sample_ids.tolist(),
            rewards=result.rewards.fields["rewards"].tolist(),
            tokens=[result.samples.sample(i)["input_ids"].tolist() for i in range(len(result.samples))],
        )
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump(gathered, f)
    failure.stop()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
