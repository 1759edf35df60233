"""GRPO with disaggregated placement: Megatron trains on the first ranks only, the last rank hosts the
engine and trains nothing.

3 CPU processes: actor TP=2 on ranks 0-1 (Megatron's groups built over those two only), one engine of TP=1
on rank 2. The weights reach the engine over the weight-update process group (sync.transport=
process_group, as between nodes) and are checked by sync.verify's per-parameter checksums; every step's
engine log-probs equal the actor's, whose old-log-prob pass ran on the samples that reached the two TP ranks
while the engine generated (rollout.stream_chunks). A second job resumes from the first's checkpoint (the rollout-only rank
restores no worker). A 2-process job with sync.transport=auto reaches the engine through shared memory (one
node), so nothing travels over the group.
"""

import json

import pytest

from distflow.testing.copy_task import copy_task, metrics_rows
from distflow.testing.launch import torchrun


def _common(model, data):
    return [
        "examples/configs/grpo_copy_cpu.yaml",
        f"model.path={model}",
        "rollout.placement=disaggregated",
        "rollout.num_ranks=1",
        "trainer.sft_warmup_steps=1",
        "trainer.val_every=0",
        "data.train_batch_size=4",
        "rollout.n=4",
        f"data.train_files=[{data}/train.parquet]",
        "data.val_files=[]",
    ]


def _engine_padding_bytes(model) -> int:
    """fp32 bytes of the zero rows SGLang's padded vocabulary adds to the embedding (and an untied lm_head)."""
    from distflow.coordination.weights.sglang_layout import sglang_padded_vocab

    cfg = json.loads((model / "config.json").read_text())
    rows = sglang_padded_vocab(cfg["vocab_size"], 1) - cfg["vocab_size"]
    return rows * cfg["hidden_size"] * 4 * (1 if cfg.get("tie_word_embeddings") else 2)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("disaggregated")
    model, data = copy_task(tmp, train=64)
    return tmp, model, data


@pytest.mark.slow
def test_training_ranks_apart_from_the_engine_over_a_process_group(inputs):
    tmp, model, data = inputs
    out = tmp / "group"
    log = torchrun(
        "distflow.train",
        nproc=3,
        module=True,
        timeout_s=900,
        args=[
            *_common(model, data),
            "actor.tp=2",
            "actor.mini_batch_size=2",  # the old-log-prob pass runs: streamed to both TP ranks in parts
            "sync.transport=process_group",
            "sync.verify=true",
            "trainer.total_steps=2",
            "checkpoint.save_every=1",
            f"trainer.output_dir={out}",
        ],
    )
    assert "engine 0: ranks [2]" in log and "actor: tp=2 pp=1 dp=1" in log, log[-3000:]
    assert "rank 2 sends" not in log  # the rollout-only rank holds no Megatron shard
    rows = metrics_rows(out)
    assert len(rows) == 2, rows
    for r in rows:
        assert r["rollout_corr/logprob_abs_diff"] <= 1e-5, r  # the engine runs the actor's weights
        assert r["perf/logprobs_streamed"] == 0.75, r  # 3 of rollout.stream_chunks=4 parts while generating
        assert r["actor/grad_norm"] > 0, r
        # Every byte reached the engine over the group (its host sends nothing and trains nothing), but for the
        # vocabulary rows SGLang pads, which the host zero-fills itself.
        assert r["sync/group_bytes"] == r["sync/bytes"] - _engine_padding_bytes(model) > 0, r
    assert [r["rollout/weight_version"] for r in rows] == [1.0, 2.0]  # warm-up sync, then one per step

    resumed = tmp / "resumed"
    log = torchrun(
        "distflow.train",
        nproc=3,
        module=True,
        timeout_s=900,
        args=[
            *_common(model, data),
            "actor.tp=2",
            "sync.transport=process_group",
            "trainer.total_steps=3",
            f"checkpoint.resume={out / 'checkpoints' / 'step_2'}",
            f"trainer.output_dir={resumed}",
        ],
    )
    assert "resumed from" in log, log[-3000:]
    rows = metrics_rows(resumed)
    assert [r["step"] for r in rows] == [3], rows
    assert rows[0]["rollout_corr/logprob_abs_diff"] <= 1e-5, rows
    assert rows[0]["rollout/weight_version"] == 3.0, rows


@pytest.mark.slow
def test_one_node_disaggregated_uses_shared_memory(inputs):
    tmp, model, data = inputs
    out = tmp / "shm"
    torchrun(
        "distflow.train",
        nproc=2,
        module=True,
        timeout_s=900,
        args=[
            *_common(model, data),
            "actor.tp=1",
            "trainer.total_steps=1",
            "checkpoint.export_hf=false",
            f"trainer.output_dir={out}",
        ],
    )
    (row,) = metrics_rows(out)
    assert row["sync/group_bytes"] == 0 and row["sync/bytes"] > 0, row
    assert row["rollout_corr/logprob_abs_diff"] <= 1e-5, row
