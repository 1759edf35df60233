"""Megatron-Core's real training code on CPU/gloo (with megatron_patches) gives the single-process result in
every parallel layout, and its distributed checkpoints load into a different layout.

Each run is tests/megatron/jobs/tiny_gpt_job.py under torchrun: a tiny GPT (2 layers, hidden 64, 4 heads,
vocab 128, seq 32) trained 3 steps with Megatron DDP, get_megatron_optimizer and the pipeline schedule.
All layouts start from the weights the single-process reference saved, so the losses must agree.
"""

import json
from pathlib import Path

import pytest

from distflow.testing.launch import torchrun

pytestmark = pytest.mark.slow

JOB = Path(__file__).parent / "jobs" / "tiny_gpt_job.py"
LOSS_TOLERANCE = 1e-5  # fp32 over 3 steps; TP/PP/EP only change summation order
EVAL_TOLERANCE = 1e-6  # same weights, forward only
MIN_TRAINING_DROP = 0.1  # the reference's loss must fall this much, or later steps would test nothing

# name -> (processes, job flags); every one is compared with the TP1 reference.
DENSE_LAYOUTS = {
    "pp2": (2, ["--pp", "2"]),
    "tp2_pp2": (4, ["--tp", "2", "--pp", "2"]),
    "tp2_sp": (2, ["--tp", "2", "--sp"]),
    "dp2_dist_opt": (2, ["--dist-opt"]),
}


def run_job(workdir: Path, name: str, nproc: int, *flags) -> dict:
    out = workdir / f"{name}.json"
    torchrun(JOB, nproc, [*flags, "--out", out], timeout_s=300)
    return json.loads(out.read_text())


def assert_same_training(run: dict, reference: dict, label: str) -> None:
    losses, expected = run["losses"], reference["losses"]
    assert len(losses) == len(expected) == 3, (label, losses, expected)
    max_diff = max(abs(a - b) for a, b in zip(losses, expected))
    print(f"{label}: losses {losses} vs reference {expected}, max |diff| {max_diff:.2e}")
    assert max_diff <= LOSS_TOLERANCE, f"{label}: {losses} vs {expected} (max |diff| {max_diff:.2e})"
    if reference["eval_loss"] is not None:
        assert abs(run["eval_loss"] - reference["eval_loss"]) <= LOSS_TOLERANCE, (label, run, reference)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("megatron_layouts")


@pytest.fixture(scope="module")
def dense_reference(workdir) -> dict:
    """TP1 on one process; saves the initial weights every other dense layout starts from."""
    reference = run_job(workdir, "tp1", 1, "--save-init", workdir / "dense_init", "--eval")
    losses = reference["losses"]
    assert losses[0] - losses[-1] >= MIN_TRAINING_DROP, f"the reference did not train: {losses}"
    return reference


@pytest.fixture(scope="module")
def tp2_run(workdir, dense_reference) -> dict:
    """TP2 from the reference's initial weights; also saves its trained weights for the resharding test."""
    return run_job(
        workdir,
        "tp2",
        2,
        "--tp",
        "2",
        "--load-init",
        workdir / "dense_init",
        "--eval",
        "--save-ckpt",
        workdir / "tp2_trained",
    )


def test_tp2_matches_tp1(tp2_run, dense_reference):
    assert_same_training(tp2_run, dense_reference, "TP2")


@pytest.mark.parametrize("layout", DENSE_LAYOUTS)
def test_layout_matches_tp1(layout, workdir, dense_reference):
    nproc, flags = DENSE_LAYOUTS[layout]
    run = run_job(workdir, layout, nproc, *flags, "--load-init", workdir / "dense_init", "--eval")
    assert run["layout"]["world"] == nproc
    assert_same_training(run, dense_reference, layout)


def test_moe_ep2_matches_ep1(workdir):
    """4 experts, top-2, alltoall dispatcher: EP1 on one process vs EP2 (2 ranks, each half the batch)."""
    reference = run_job(workdir, "moe_ep1", 1, "--moe", "--save-init", workdir / "moe_init")
    assert reference["losses"][0] - reference["losses"][-1] >= MIN_TRAINING_DROP, reference["losses"]
    run = run_job(workdir, "moe_ep2", 2, "--moe", "--ep", "2", "--load-init", workdir / "moe_init")
    assert_same_training(run, reference, "MoE EP2")


def test_checkpoint_saved_at_tp2_loads_at_pp2(workdir, tp2_run):
    """The TP2 run's trained weights, loaded into PP2, give the same loss on a fixed batch."""
    loaded = run_job(
        workdir,
        "pp2_from_tp2",
        2,
        "--pp",
        "2",
        "--steps",
        "0",
        "--load-ckpt",
        workdir / "tp2_trained",
        "--eval",
    )
    diff = abs(loaded["eval_loss"] - tp2_run["eval_loss"])
    print(
        f"checkpoint TP2 -> PP2: eval loss {loaded['eval_loss']} vs {tp2_run['eval_loss']}, |diff| {diff:.2e}"
    )
    assert diff <= EVAL_TOLERANCE, (loaded["eval_loss"], tp2_run["eval_loss"])
