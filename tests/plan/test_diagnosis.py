"""A plan that does not fit exits 1 and names its causes largest first, with remedies not already applied;
every path `python -m distflow.plan --help` names exists."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from distflow.plan import memory
from distflow.plan.__main__ import EXIT_DOES_NOT_FIT, EXIT_FITS, main
from distflow.plan.model_size import ShardParams

REPO = Path(__file__).resolve().parents[2]
SCRIPT_72B = REPO / "examples" / "grpo_qwen2.5_72b_8nodes.sh"
BASE = str(REPO / "examples" / "configs" / "gpu_base.yaml")
QWEN7B = str(REPO / "examples" / "model_configs" / "qwen2.5-7b.json")


def dry_run(script: Path, *overrides) -> subprocess.CompletedProcess:
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHON": sys.executable,
        "DRY_RUN": "1",
        "MODEL_PATH": "/nonexistent/model",
    }
    return subprocess.run(
        ["bash", str(script), *overrides], env=env, capture_output=True, text=True, timeout=300
    )


def warnings_of(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("WARNING")]


def test_72b_at_tp4_exits_1_naming_the_actor_states_first():
    """The 72B script at actor TP 4 (the reference follows): 114 GiB of actor states per GPU, recompute on."""
    result = dry_run(SCRIPT_72B, "actor.tp=4", "actor.pp=1")
    assert result.returncode == EXIT_DOES_NOT_FIT, result.stderr + result.stdout
    warnings = warnings_of(result.stdout)
    assert warnings and all("does not fit" in w for w in warnings), warnings
    first = warnings[0]
    largest = re.search(r"Largest first: (.+?) ([\d.]+) GiB", first)
    assert (
        largest
        and largest.group(1) == "actor states"
        and float(largest.group(2)) == pytest.approx(114.3, abs=0.2)
    )
    assert "raise actor.tp or actor.pp (ref alike)" in first
    assert "optimizer_cpu_offload: true" in first  # not set in the script
    assert "use_distributed_optimizer" not in result.stdout  # already on
    assert "recompute_granularity=full" not in "".join(warnings)  # already on in the script
    assert "sequence_parallel=true" not in "".join(warnings)  # already on
    # the staging buffers are 1 GiB of 166: lowering sync.bucket_mb is named last if at all
    sync = next(w for w in warnings if "phase sync_weights" in w)
    assert sync.index("actor states") < sync.index("engine weights")
    assert "sync.bucket_mb" not in sync.split("Largest first:")[1].split(";")[0]
    assert "DOES NOT FIT" in result.stdout


def test_72b_as_shipped_fits_and_exits_0():
    result = dry_run(SCRIPT_72B)
    assert result.returncode == EXIT_FITS, result.stderr + result.stdout
    assert "fits: every phase within the GPU's memory" in result.stdout and not warnings_of(result.stdout)


def test_remedies_are_ranked_by_what_they_save_and_skip_what_is_applied(capsys):
    """7B at TP 1 on 40 GiB GPUs: activations and states both over; recompute is off (offered), then on."""
    args = ["--world-size", "8", "--gpu-memory-gb", "40", "--model-config", QWEN7B]
    assert main([BASE, "actor.optim.use_distributed_optimizer=false", *args]) == EXIT_DOES_NOT_FIT
    out = capsys.readouterr().out
    train = next(w for w in warnings_of(out) if "phase train_actor" in w)
    assert (
        "actor.recompute_granularity=full" in train and "actor.optim.use_distributed_optimizer=true" in train
    )
    for cause in train.split("Largest first: ")[1].split("; "):
        saved = [float(x) for x in re.findall(r"\(-([\d.]+) GiB\)", cause)]
        assert saved == sorted(saved, reverse=True), cause
    sizes = [
        float(x) for x in re.findall(r"(?:^|; )[a-z ]+?([\d.]+) GiB \(", train.split("Largest first: ")[1])
    ]
    assert sizes == sorted(sizes, reverse=True), train
    assert main([BASE, "actor.recompute_granularity=full", *args]) == EXIT_DOES_NOT_FIT
    out = capsys.readouterr().out
    assert "recompute_granularity=full recompute_method" not in "".join(warnings_of(out))


def test_optimizer_cpu_offload_leaves_the_gpu(capsys):
    params = ShardParams(dense=1e9, expert=0.0)
    kept = memory.model_state_bytes(params, "bfloat16", True, True, dense_dp=4, expert_dp=1)
    half = memory.model_state_bytes(
        params, "bfloat16", True, True, dense_dp=4, expert_dp=1, cpu_offload_fraction=0.5
    )
    assert kept.optimizer == 12e9 / 4 and half.optimizer == 12e9 / 8 and half.grads == kept.grads
    args = [BASE, "actor.tp=2", "--world-size", "8", "--model-config", QWEN7B]
    main(args)
    on_gpu = capsys.readouterr().out
    main([*args, "actor.optim.megatron={optimizer_cpu_offload: true, optimizer_offload_fraction: 1.0}"])
    offloaded = capsys.readouterr().out
    assert "optimizer 10.6 (distributed" in on_gpu and "optimizer 0.0 (distributed" in offloaded
    assert "(100% of it in CPU memory: optimizer_cpu_offload)" in offloaded


def test_every_path_the_help_names_exists():
    result = subprocess.run(
        [sys.executable, "-m", "distflow.plan", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    paths = re.findall(r"\b((?:examples|docs|tools)/[\w./-]+\.(?:yaml|json|sh|md|py))", result.stdout)
    assert paths, result.stdout
    missing = [p for p in paths if not (REPO / p).exists()]
    assert not missing, f"plan --help names {missing}, which do not exist"
    assert "Exit status: 0 the plan fits" in result.stdout and "1 it does not fit" in result.stdout
