"""LookaheadRollout.settle (the collection of partial rollouts before a checkpoint) when an engine dies under
it: the rollouts after the lost one are not collected from the restarted engine, which serves no weights
until the next sync, but marked lost, so the steps that take them generate them again."""

from distflow.dag.lookahead import LookaheadRollout, Rollout


def _settled(lost_at: int | None) -> tuple[LookaheadRollout, list[int]]:
    rollouts = object.__new__(LookaheadRollout)  # settle and state_dict need only these
    rollouts.max_staleness = 3
    rollouts.ahead = {
        2: Rollout(2, ["p2"], 1),  # generated whole: settle leaves it alone
        3: Rollout(3, ["p3"], 1, submitted=True),
        4: Rollout(4, ["p4"], 2, submitted=True),
        5: Rollout(5, ["p5"], 2, submitted=True),
    }
    collected = []

    def generate(step, prompts, record, version=None):
        collected.append(step)
        lost = "engine 0: SGLang engine: engine process 7 died" if step == lost_at else None
        return Rollout(step, prompts, version, {"samples": step}, lost=lost)

    rollouts._generate = generate
    rollouts.settle()
    return rollouts, collected


def test_every_submitted_rollout_is_collected_when_none_is_lost():
    rollouts, collected = _settled(lost_at=None)
    assert collected == [3, 4, 5]
    assert all(not r.submitted and r.lost is None for r in rollouts.ahead.values())
    assert rollouts.state_dict()["ahead"].keys() == {2, 3, 4, 5}  # a checkpoint can hold them


def test_the_rollouts_after_a_lost_one_are_marked_lost_not_collected():
    rollouts, collected = _settled(lost_at=4)
    assert collected == [3, 4]
    ahead = rollouts.ahead
    assert ahead[3].lost is None and ahead[3].outputs == {"samples": 3}
    assert ahead[4].lost.startswith("engine 0: ")
    assert ahead[5].lost == f"its engine restarted in step 4's rollout ({ahead[4].lost})"
    assert (ahead[5].prompts, ahead[5].version, ahead[5].submitted) == (["p5"], 2, False)
    assert ahead[2].lost is None and not ahead[2].submitted
    assert rollouts.state_dict()["ahead"].keys() == {2, 3, 4, 5}
