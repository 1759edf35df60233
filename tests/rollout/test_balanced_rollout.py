"""Rollout balancing with two real SGLang CPU engines (2 colocated ranks, engine_tp=1): with engine 1 slowed
by the fault hook, engine 0 generates engine 1's chunks, and every sample still comes back to its home rank
with the ids, groups, tokens and log-probs that balance=partition gives on the same seeds. The same holds when
engine 1 dies mid-rollout (engine 0 adopts its unfinished chunks) and after engine 1 restarts."""

from pathlib import Path

import pytest

from distflow.testing.launch import tagged_json, torchrun

JOB = Path(__file__).parent / "jobs" / "balanced_rollout_job.py"


@pytest.mark.slow
def test_stolen_chunks_come_home_with_the_partition_results(tiny_qwen2, tmp_path):
    out = torchrun(JOB, nproc=2, args=[tiny_qwen2, tmp_path / "run"], timeout_s=900)
    assert "[rollout] engine 1 died in step 3's rollout" in out, out[-3000:]
    results = {r["rank"]: r for r in tagged_json(out, "BALANCE")}
    assert sorted(results) == [0, 1], out[-3000:]
    for rank, r in results.items():
        part = r["partition"]
        assert len(part["ids"]) == 4 * 2, part["ids"]  # 4 prompts x n=2, all at home
        assert part["ids"] == [rank * 1_000_000 + i for i in range(8)]
        assert part["groups"] == [rank * 1_000_000 + i // 2 for i in range(8)]
        assert part["ground_truth"] == [f"{rank}/{i // 2}" for i in range(8)]
        for run in ("steal", "died", "after_restart"):
            for key in ("ids", "groups", "tokens", "responses", "ground_truth"):
                assert r[run][key] == part[key], (rank, run, key)
            flat = [lp for row in r[run]["logprobs"] for lp in row]
            assert flat == pytest.approx([lp for row in part["logprobs"] for lp in row], abs=1e-5), run
        assert r["engine_restarts"] == rank  # engine 1 restarted once, engine 0 never
        # the n samples of a prompt differ (own seeds), so equal tokens are not a constant output
        assert len({tuple(t) for t in part["responses"]}) > 1, part["responses"]
        assert r["partition_stats"]["stolen_groups"] == 0
        assert r["partition_stats"]["engine_tokens"][rank] == sum(len(t) for t in part["responses"])
    stats = results[0]["steal_stats"]
    assert stats == results[1]["steal_stats"]  # the same totals on every owner
    assert stats["stolen_groups"] > 0, stats
    # engine 0 generated more than its own share: everything it generated beyond its partition's tokens
    own0 = sum(len(t) for t in results[0]["partition"]["responses"])
    assert stats["engine_tokens"][0] > own0, (stats, own0)
    assert sum(stats["engine_tokens"]) == sum(results[0]["partition_stats"]["engine_tokens"])
