"""`python -m distflow.plan`: warnings where memory runs out, layout and model errors before anything starts."""

from pathlib import Path

import pytest

from distflow.plan.__main__ import main

REPO = Path(__file__).resolve().parents[2]
BASE = str(REPO / "examples" / "configs" / "gpu_base.yaml")
QWEN7B = str(REPO / "examples" / "model_configs" / "qwen2.5-7b.json")
QWEN30B = str(REPO / "examples" / "model_configs" / "qwen3-30b-a3b.json")


def plan(capsys, *args):
    code = main([BASE, *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_fitting_plan_prints_every_section(capsys):
    code, out, err = plan(
        capsys,
        "actor.tp=2",
        "rollout.engine_tp=2",
        "actor.recompute_granularity=full",
        "--world-size",
        "8",
        "--gpu-memory-gb",
        "80",
        "--model-config",
        QWEN7B,
    )
    assert code == 0, err
    for line in (
        "== placement and layouts",
        "rollout: 4 SGLang engine(s) x TP 2",
        "actor: tp=2 pp=1 dp=4",
        "== memory per GPU",
        "phase train_actor",
        "== data plan",
        "== weight sync",
        "lower bound",
        "fits: every phase within the GPU's memory",
    ):
        assert line in out
    assert "WARNING" not in out


def test_over_memory_warns(capsys):
    # 7.6 B parameters on one GPU each (TP 1) of 24 GiB: the model states alone are over.
    code, out, _ = plan(capsys, "--world-size", "8", "--gpu-memory-gb", "24", "--model-config", QWEN7B)
    assert code == 1  # does not fit
    warnings = [line for line in out.splitlines() if line.startswith("WARNING")]
    assert any("phase train_actor needs" in w and "over the 24.0 GiB available" in w for w in warnings), out
    assert any("the engine's start (its weights do not fit its share)" in w for w in warnings), out
    assert "OVER" in out and "DOES NOT FIT" in out and "fits: every phase" not in out


def test_sync_staging_over_memory_warns(capsys):
    args = (
        "actor.tp=2",
        "rollout.engine_tp=2",
        "actor.recompute_granularity=full",
        "--world-size",
        "8",
        "--gpu-memory-gb",
        "80",
        "--model-config",
        QWEN7B,
    )
    _, out, _ = plan(capsys, *args)
    staging = next(line for line in out.splitlines() if line.startswith("phase sync_weights"))
    # 2 x 512 MiB; the released engine resumes its weights only, the KV pool waits for generation
    assert "engine weights 7.1 + sync staging 1.0 = 40.0" in staging and staging.endswith("ok"), staging
    _, out, _ = plan(capsys, *args, "sync.bucket_mb=8192")  # 2 x 7.1 GiB: the whole slice, twice
    assert "WARNING" not in out, out
    code, out, _ = plan(capsys, *args, "sync.bucket_mb=8192", "rollout.release_memory_in_training=false")
    warning = next(line for line in out.splitlines() if line.startswith("WARNING"))
    assert (
        code == 1 and "does not fit: phase sync_weights" in warning and "lower sync.bucket_mb" in warning
    ), out


def test_distributed_optimizer_off_costs_more(capsys):
    args = ("actor.tp=2", "--world-size", "8", "--model-config", QWEN7B)
    _, on, _ = plan(capsys, *args)
    _, off, _ = plan(capsys, *args, "actor.optim.use_distributed_optimizer=false")
    assert "(distributed over DP; 42.6 without)" in on and "optimizer 42.6 (not distributed)" in off


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ("actor.tp=3", "--world-size", "8"),
            "LayoutError: actor: world size 8 is not divisible by tp*pp*cp",
        ),
        (
            ("actor.tp=8", "--world-size", "8"),
            "LayoutError: actor.tp=8 does not divide the model's 28 attention heads",
        ),
        (
            ("actor.pp=3", "--world-size", "6"),
            "LayoutError: actor: 28 layers cannot be split evenly over pp*vpp",
        ),
        (("rollout.engine_tp=3", "--world-size", "6"), "LayoutError: rollout.engine_tp=3 does not divide"),
        (("actor.ep=2", "--world-size", "8"), "LayoutError: actor.ep=2 but the model is dense"),
        (("actor.tpp=2", "--world-size", "8"), "did you mean actor.tp?"),
    ],
)
def test_bad_layouts_fail_with_the_layout_error(capsys, args, message):
    code, out, err = plan(capsys, *args, "--model-config", QWEN7B)
    assert code == 2 and out == ""
    assert message in err


def test_moe_layout_errors(capsys):
    code, _, err = plan(capsys, "actor.ep=3", "--world-size", "6", "--model-config", QWEN30B)
    assert code == 2 and "LayoutError" in err
    code, out, err = plan(
        capsys,
        "actor.tp=2",
        "actor.ep=8",
        "actor.etp=1",
        "rollout.engine_tp=4",
        "actor.recompute_granularity=full",
        "--world-size",
        "16",
        "--model-config",
        QWEN30B,
    )
    assert code == 0, err + out
    assert "ep=8 etp=1" in out and "expert DP 2" in out


def test_disaggregated_placement(capsys):
    code, out, err = plan(
        capsys,
        "rollout.placement=disaggregated",
        "rollout.num_ranks=4",
        "actor.tp=2",
        "--world-size",
        "12",
        "--gpus-per-node",
        "4",
        "--model-config",
        QWEN7B,
    )
    assert code == 0, err
    assert "training ranks 0-7 (nodes 0-1), engine ranks 8-11 (node 2)" in out
    assert "phase generate      (rollout ranks)" in out and "phase train_actor   (training ranks)" in out


def test_no_model_is_an_error(capsys):
    code, _, err = plan(capsys, "--world-size", "8")
    assert code == 2 and "--model-config" in err
    code, _, err = plan(capsys, "--world-size", "8", "--model-config", "/nonexistent/config.json")
    assert code == 2 and "no such model config" in err


def test_flash_attention_keeps_no_softmax(capsys):
    args = ("actor.tp=2", "--world-size", "8", "--model-config", QWEN7B)
    _, unfused, _ = plan(capsys, *args)
    _, flash, _ = plan(capsys, *args, "--attention", "flash")

    def activations(out):
        return float(out.split("activations ")[1].split()[0])

    assert activations(flash) < activations(unfused)
    assert "unfused attention" in unfused and "flash attention)" in flash
