"""MegatronWorker on real Megatron-Core over gloo, against the Hugging Face model and against itself.

Tiny Qwen2 models with vocab 300 (padded to 384 at TP1, 512 at TP2, so the padding is masked) and a
right-padded batch of variable-length rows. Three torchrun jobs (1, 2 and 4 processes) run every layout
in turn (see jobs/worker_job.py); the numbers to match come from transformers in this process
(worker_reference.py):
- log-probs and entropy at TP1, TP2, TP2+SP (with full recomputation), PP2, DP2, PP2xVPP2 (4 layers),
  TP2xPP2, PP2xVPP2xDP2, and for a Qwen3-MoE at TP1 and EP2, equal HF's;
- gradients of a PPO-style loss with an entropy bonus: TP1's equal HF's (dense; transformers 5 names
  MoE experts differently from the checkpoint), every other layout's TP1's;
- dynamic batching: fixed micro-batch sizes and token budgets give the same loss, grad norm and weights
  after two optimizer steps (at TP1, and at PP2xVPP2, where every micro-batch is padded to one shape);
- critic: values of the right shape and alignment, equal across layouts; MSE falls under LR warm-up.
"""

from pathlib import Path

import pytest
import torch
from worker_reference import hf_reference

from distflow.models.tiny import make_tiny_model
from distflow.testing.launch import torchrun

JOB = Path(__file__).parent / "jobs" / "worker_job.py"
LOGPROB_TOL = 1e-4  # fp32 max abs diff; measured ~3e-6 (log-probs), ~1e-6 (entropy)
HF_GRAD_TOL = 1e-4  # relative, per tensor, TP1 vs transformers' autograd; measured ~2e-6
LAYOUT_GRAD_TOL = 1e-5  # relative, per tensor, any layout vs TP1; measured <= ~2e-6
DYNAMIC_TOL = 1e-6  # loss and grad norm (relative), weights (absolute); measured <= ~2e-7

ONE_RANK = ["actor:m2:tp=1", "actor:m4:tp=1", "actor:moe:tp=1", "dynamic:m2:tp=1", "critic:m2:tp=1"]
TWO_RANKS = [
    "actor:m2:tp=2",
    "actor:m2:tp=2,sp=1,rc=1",
    "actor:m2:pp=2",
    "actor:m2:dp=2",
    "actor:m4:pp=2,vpp=2",
    "actor:moe:ep=2",
    "dynamic:m4:pp=2,vpp=2",
    "critic:m2:tp=2,sp=1",
    "critic:m2:pp=2",
]
FOUR_RANKS = ["actor:m2:tp=2,pp=2", "actor:m4:pp=2,vpp=2,dp=2"]
JOBS = {"one_rank": (1, ONE_RANK), "two_ranks": (2, TWO_RANKS), "four_ranks": (4, FOUR_RANKS)}
ACTOR_CASES = [(job, case) for job, (_, cases) in JOBS.items() for case in cases if case.startswith("actor")]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """(path of the jobs' inputs file, {model: HF reference})."""
    root = tmp_path_factory.mktemp("megatron_worker")
    models = {
        "m2": make_tiny_model("qwen2", root / "qwen2_vocab300", vocab=300),
        "m4": make_tiny_model("qwen2", root / "qwen2_vocab300_4layers", vocab=300, layers=4),
        "moe": make_tiny_model("qwen3_moe", root / "qwen3_moe_vocab300", vocab=300),
    }
    batches, references = {}, {}
    for name, model_dir in models.items():
        batches[name], references[name] = hf_reference(model_dir)
    path = root / "inputs.pt"
    torch.save({"models": {k: str(v) for k, v in models.items()}, "batches": batches}, path)
    return path, references


def _run_job(inputs, tmp_path_factory, name: str) -> dict:
    nproc, cases = JOBS[name]
    out = tmp_path_factory.mktemp(name)
    torchrun(JOB, nproc=nproc, args=["--inputs", inputs[0], "--out", out, *cases], timeout_s=300)
    return {case: torch.load(out / f"{i}.pt", weights_only=False)["result"] for i, case in enumerate(cases)}


@pytest.fixture(scope="module")
def one_rank(inputs, tmp_path_factory):
    return _run_job(inputs, tmp_path_factory, "one_rank")


@pytest.fixture(scope="module")
def two_ranks(inputs, tmp_path_factory):
    return _run_job(inputs, tmp_path_factory, "two_ranks")


@pytest.fixture(scope="module")
def four_ranks(inputs, tmp_path_factory):
    return _run_job(inputs, tmp_path_factory, "four_ranks")


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


def _model(case: str) -> str:
    return case.split(":")[1]


@pytest.mark.slow
@pytest.mark.parametrize("job,case", ACTOR_CASES)
def test_logprobs_and_entropy_equal_hf(job, case, inputs, request):
    result = request.getfixturevalue(job)[case]
    reference = inputs[1][_model(case)]
    assert (result["logprobs"] - reference["logprobs"]).abs().max() <= LOGPROB_TOL
    assert (result["entropy"] - reference["entropy"]).abs().max() <= LOGPROB_TOL
    assert torch.all(result["logprobs"][:, 0] == 0) and torch.all(result["entropy"][:, 0] == 0)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["m2", "m4"])
def test_tp1_gradients_equal_hf(model, inputs, one_rank):
    result, reference = one_rank[f"actor:{model}:tp=1"], inputs[1][model]
    assert sorted(result["grads"]) == sorted(reference["grads"])
    for name, grad in result["grads"].items():
        assert _relative(grad, reference["grads"][name]) <= HF_GRAD_TOL, name
    assert result["metrics"]["loss"] == pytest.approx(reference["loss"], rel=1e-5)
    grad_norm = torch.stack([g.norm() for g in reference["grads"].values()]).norm().item()
    assert result["metrics"]["grad_norm"] == pytest.approx(grad_norm, rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("job,case", [c for c in ACTOR_CASES if not c[1].endswith(":tp=1")])
def test_gradients_equal_tp1(job, case, one_rank, request):
    result = request.getfixturevalue(job)[case]
    tp1 = one_rank[f"actor:{_model(case)}:tp=1"]
    assert sorted(result["grads"]) == sorted(tp1["grads"])
    for name, grad in result["grads"].items():
        assert _relative(grad, tp1["grads"][name]) <= LAYOUT_GRAD_TOL, name
    for key in ("loss", "grad_norm", "pg_clipfrac", "entropy"):
        assert result["metrics"][key] == pytest.approx(tp1["metrics"][key], rel=LAYOUT_GRAD_TOL, abs=1e-7), (
            key
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    "job,case", [("one_rank", "dynamic:m2:tp=1"), ("two_ranks", "dynamic:m4:pp=2,vpp=2")]
)
def test_dynamic_batching_gives_the_same_update(job, case, request):
    variants = request.getfixturevalue(job)[case]
    assert len({v["metrics"]["micro_batches"] for v in variants}) >= 2, "the variants must split differently"
    base = variants[0]
    for variant in variants[1:]:
        for key in ("loss", "grad_norm"):
            assert variant["metrics"][key] == pytest.approx(base["metrics"][key], rel=DYNAMIC_TOL), variant[
                "variant"
            ]
        assert variant["metrics"]["optimizer_steps"] == 2
        for name, weight in variant["weights"].items():
            assert (weight - base["weights"][name]).abs().max() <= DYNAMIC_TOL, (variant["variant"], name)
    moved = max((base["weights"][n] - w).abs().max().item() for n, w in variants[-1]["weights"].items())
    assert moved > 0  # compared against itself only if nothing trained: rule that out


@pytest.mark.slow
def test_critic_values_and_training(inputs, one_rank, two_ranks):
    batch = torch.load(inputs[0])["batches"]["m2"]
    tp1 = one_rank["critic:m2:tp=1"]
    assert tp1["values"].shape == batch["input_ids"].shape
    assert torch.all(tp1["values"][:, 0] == 0)
    assert torch.all(tp1["values"][batch["attention_mask"] == 0] == 0)
    assert tp1["values"][:, 1:][batch["attention_mask"][:, 1:] == 1].abs().min() > 0
    for case in ("critic:m2:tp=2,sp=1", "critic:m2:pp=2"):
        other = two_ranks[case]
        assert (other["values"] - tp1["values"]).abs().max() <= 1e-5, case
        assert other["losses"] == pytest.approx(tp1["losses"], rel=1e-5), case
    losses = tp1["losses"]
    assert all(b < a for a, b in zip(losses, losses[1:])) and losses[-1] < 0.8 * losses[0], losses
    # Warm-up over 4 steps: the first update already moves (lr/4), the 4th uses the full lr.
    assert tp1["lrs"] == pytest.approx([0.75e-3, 1.5e-3, 2.25e-3, 3e-3])
