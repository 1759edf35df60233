"""Checkpoints of real Megatron-Core workers (gloo, 2 CPU processes): exact resume, a crash mid-save, NaN steps.

- resume: train 2 steps, checkpoint, train 2 more; a fresh worker that resumes from the checkpoint trains the
  same 2 steps to the same metrics and weights (model, Adam state, LR schedule, RNG and loader position
  restored), at TP=2 (sharded tensors) and DP=2 (per-rank RNG states that differ), also with the distributed
  optimizer (Adam state sharded over DP);
- crash: a save that fails half-way (step 2) leaves `latest` at step 1, and resuming loads step 1;
- NaN loss or NaN gradients: the step is skipped (weights unchanged, reported as nan_loss/nan_grad/
  skipped_steps); three in a row stop the worker with a clear error, and a good step in between resets the count.
"""

import json
from pathlib import Path

import pytest
import torch

from distflow.checkpointing import manifest
from distflow.models.tiny import make_tiny_model
from distflow.testing.launch import JobFailed, torchrun

JOB = Path(__file__).parent / "jobs" / "checkpoint_job.py"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tiny_model("qwen2", tmp_path_factory.mktemp("ckpt_model") / "tiny", vocab=300)


def run_case(model, run_dir, case, tp=1, dist_opt=False):
    flags = ["--dist-opt"] if dist_opt else []
    torchrun(JOB, nproc=2, args=["--model", model, "--dir", run_dir, "--tp", tp, *flags, case], timeout_s=300)
    return torch.load(Path(run_dir) / f"{case}.pt", weights_only=False)


@pytest.mark.parametrize(
    "tp,dist_opt", [(2, False), (1, False), (1, True)], ids=["tp2", "dp2", "dp2_distopt"]
)
def test_resume_continues_exactly(model, tmp_path, tp, dist_opt):
    straight = run_case(model, tmp_path, "straight", tp, dist_opt)
    root = tmp_path / "checkpoints"
    assert (root / "latest").read_text().strip() == "step_2"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_2"]
    meta = json.loads((root / "step_2" / "meta.json").read_text())
    assert meta["step"] == 2 and meta["run_id"] == "run0" and meta["world_size"] == 2
    assert meta["roles"]["actor"]["layout"]["tp"] == tp
    assert sorted(p.name for p in (root / "step_2").iterdir()) == [
        "actor",
        "manifest.json",
        "meta.json",
        "rank_0.pt",
        "rank_1.pt",
    ]
    # The manifest lists every file the ranks wrote, with digests that match (manifest.py).
    listed = json.loads((root / "step_2" / "manifest.json").read_text())["files"]
    assert any(name.startswith("actor/") and name.endswith(".distcp") for name in listed), sorted(listed)
    assert manifest.check(root / "step_2", checksums=True) == []

    resumed = run_case(model, tmp_path, "resumed", tp, dist_opt)
    assert resumed["start"] == 2 and resumed["loader"] == 2  # the position saved after step 2
    assert resumed["tracker"] == {"run_id": "run0", "resume_step": 2}
    for a, b in zip(straight["metrics"], resumed["metrics"]):
        for key in a:
            assert abs(a[key] - b[key]) <= 1e-6 * max(1.0, abs(a[key])), (key, a[key], b[key])
    assert straight["metrics"][0]["lr"] != straight["metrics"][1]["lr"]  # the schedule moves (warm-up)
    for name, tensor in straight["weights"].items():
        assert torch.equal(tensor, resumed["weights"][name]), name


def test_disk_full_mid_save_is_named_and_keeps_previous_checkpoint(model, tmp_path):
    with pytest.raises(JobFailed, match="exit code") as failed:
        run_case(model, tmp_path, "crash")
    root = tmp_path / "checkpoints"
    # The rank that failed first names the folder it could not write and what is left intact.
    assert f"writing checkpoint step 2 to {root / '.incomplete_step_2'} failed (" in str(failed.value), str(
        failed.value
    )[-3000:]
    assert f"the last complete checkpoint, {root / 'step_1'}, is intact" in str(failed.value)
    assert (root / "latest").read_text().strip() == "step_1"
    assert (root / ".incomplete_step_2" / "actor").is_dir()  # the half-written save, never read
    assert not (root / "step_2").exists()
    restored = run_case(model, tmp_path, "after_crash")
    assert restored["start"] == 1
    saved = torch.load(tmp_path / "weights_step1.pt")
    for name, tensor in saved.items():
        assert torch.equal(tensor, restored["weights"][name]), name


def test_nan_loss_skips_the_step_then_stops(model, tmp_path):
    r = run_case(model, tmp_path, "nan", tp=2)
    for name, tensor in r["before"].items():
        assert torch.equal(tensor, r["after_bad"][name]), name  # skipped steps leave the weights alone
    assert [m["nan_loss"] for m in r["bad"]] == [1.0, 1.0]
    assert [m["skipped_steps"] for m in r["bad"]] == [1.0, 1.0]
    assert r["good"][0]["nan_loss"] == 0.0 and r["good"][0]["skipped_steps"] == 0.0
    # NaN gradients under a finite loss are skipped too (an fp32 optimizer has no loss scaler to catch them).
    assert [(m["nan_loss"], m["nan_grad"], m["skipped_steps"]) for m in r["bad_again"]] == [
        (0.0, 1.0, 1.0)
    ] * 2
    for name, tensor in r["after_good"].items():
        assert torch.equal(tensor, r["after_bad_again"][name]), name
    assert r["good"][0]["nan_grad"] == 0.0
    # The good step reset the count: two more bad ones do not stop it, a third in a row (NaN loss) does.
    assert r["error"] is not None and "3 optimizer steps in a row" in r["error"]
    assert "trainer.max_consecutive_bad_steps=3" in r["error"]
