"""An engine spanning nodes (rollout.engine_nnodes=2): SGLang's multi-node mode, started by the trainer ranks.

2 CPU processes, colocated, actor TP=2, one engine of TP=2 split as two "nodes" of one rank each (on one
host: SGLang rendezvouses over TCP at the owner's address as it would between hosts). Rank 0 (node 0) owns
the engine and serves requests; rank 1 starts node 1's scheduler from the rendezvous address the owner put
in the job's store and logs to engine0.node1.log. The weight sync loads rank 1's shard through a handle
rank 1 made itself (as across hosts); the engine's log-probs equal the actor's at every step.

The job also carries an engine death: node 1's scheduler is SIGKILLed as rank 1 starts step 2's rollout.
Either the owner's generation hears of it (its scheduler's broadcast to node 1 fails) or, if it had
finished, the sync's collective check does; either way both ranks restart their shares together in the
weight sync (a fresh rendezvous), and the step's rollout is generated on the restarted engine, whose
log-probs again equal the actor's. No job restart.
"""

import pytest

from distflow.testing.copy_task import copy_task, metrics_rows
from distflow.testing.launch import torchrun
from distflow.testing.phase_faults import fault_env


@pytest.mark.slow
def test_grpo_with_an_engine_over_two_nodes(tmp_path):
    model, data = copy_task(tmp_path, train=64)
    out = tmp_path / "run"
    log = torchrun(
        "distflow.train",
        nproc=2,
        module=True,
        timeout_s=900,
        env=fault_env("generate", 2, rank=1, sig="ENGINE"),
        args=[
            "examples/configs/grpo_copy_cpu.yaml",
            f"model.path={model}",
            f"trainer.output_dir={out}",
            "actor.tp=2",
            "rollout.engine_tp=2",
            "rollout.engine_nnodes=2",
            "trainer.total_steps=2",
            "trainer.sft_warmup_steps=1",
            "trainer.val_every=0",
            "data.train_batch_size=4",
            "rollout.n=4",
            "sync.verify=true",
            f"data.train_files=[{data}/train.parquet]",
            "data.val_files=[]",
            "checkpoint.export_hf=false",
            "rollout.engine_restarts=1",
            "dag.pipeline=distflow.testing.phase_faults:pipeline",
        ],
    )
    assert "1 engine(s) of TP 2" in log, log[-3000:]
    logs = out / "engine_logs"
    assert (logs / "engine0.log").is_file() and (logs / "engine0.node1.log").is_file()
    rows = metrics_rows(out)
    assert len(rows) == 2, rows
    for r in rows:
        assert r["rollout_corr/logprob_abs_diff"] <= 1e-5, r
        assert r["actor/grad_norm"] > 0, r
    assert [r["rollout/weight_version"] for r in rows] == [1.0, 2.0]
    assert "[phase_faults] rank 1: engine killed in generate of step 2" in log, log[-3000:]
    assert "[rollout] engine 0 is dead (engine process" in log, log[-3000:]
    assert "its 2 nodes restart it together; it restarts (1 of rollout.engine_restarts=1)" in log, log[-3000:]
    assert "[rollout] engine 0 node 1 is dead" in log and "its share restarts with the engine" in log, log[
        -3000:
    ]
    assert "restarted attempt" not in log, log[-3000:]
    assert [r["rollout/engine_restarts"] for r in rows] == [0.0, 1.0], rows
