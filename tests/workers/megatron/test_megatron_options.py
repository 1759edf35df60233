"""Memory options of the Megatron roles: what is supported is passed to Megatron, the rest is refused by
name at config time and when a worker is built.

- ref.offload=true: the reference model's parameters wait in CPU memory between forwards on GPU; on CPU
  there is nothing to move, and the log-probs are those without offload (the GPU path is not run here);
- actor/critic.offload=true: a ConfigError / ValueError that says what is supported instead;
- {role}.optim.megatron: Megatron OptimizerConfig fields reach Megatron's optimizer (checked with one
  that changes the update on CPU: decoupled_weight_decay=false, Adam with L2 decay instead of AdamW);
  unknown and DistFlow-owned keys are refused; optimizer_cpu_offload on CPU says it needs CUDA;
- recompute_* fields go to TransformerConfig (run with full recomputation in test_megatron_worker).
"""

from pathlib import Path

import pytest
import torch
from worker_reference import hf_reference

from distflow.config.loader import ConfigError
from distflow.config.schema import DistFlowConfig
from distflow.config.validate import validate
from distflow.models.tiny import make_tiny_model
from distflow.testing.launch import torchrun

JOB = Path(__file__).parent / "jobs" / "options_job.py"


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    root = tmp_path_factory.mktemp("options")
    model = make_tiny_model("llama", root / "llama")
    batch, _ = hf_reference(model)
    torch.save({"model": str(model), "batch": batch}, root / "inputs.pt")
    torchrun(JOB, nproc=1, args=["--inputs", root / "inputs.pt", "--out", root / "out.pt"], timeout_s=300)
    return torch.load(root / "out.pt", weights_only=False)


@pytest.mark.slow
def test_ref_offload_on_cpu_moves_nothing_and_changes_nothing(result):
    assert result["ref_offload_active"] is False
    assert torch.equal(result["ref_offload_logprobs"], result["ref_logprobs"])


@pytest.mark.slow
def test_optimizer_passthrough_reaches_megatron(result):
    assert result["decoupled"] == {"default": True, "adam_l2": False}
    default, l2 = result["weights"]["default"], result["weights"]["adam_l2"]
    moved = max((default[n] - l2[n]).abs().max().item() for n in default)
    assert moved > 1e-6, "L2 decay and AdamW's decoupled decay must update differently"


@pytest.mark.slow
def test_unsupported_options_fail_when_the_worker_is_built(result):
    errors = result["errors"]
    for role in ("actor", "critic"):
        assert f"{role}.offload=true is not supported" in errors[f"{role}_offload"]
        assert f"{role}.optim.megatron={{optimizer_cpu_offload: true" in errors[f"{role}_offload"]
    assert "optimizer_cpu_offload=true needs CUDA" in errors["optimizer_cpu_offload"]


def _config(**sections) -> DistFlowConfig:
    cfg = DistFlowConfig()
    for dotted, value in sections.items():
        *path, last = dotted.split("__")
        target = cfg
        for part in path:
            target = getattr(target, part)
        setattr(target, last, value)
    return cfg


@pytest.mark.parametrize(
    "overrides,words",
    [
        (
            dict(actor__offload=True),
            [
                "actor.offload=true is not supported",
                "ref.offload=true",
                "actor.optim.megatron={optimizer_cpu_offload: true",
            ],
        ),
        (dict(critic__offload=True), ["critic.offload=true is not supported"]),
        (
            dict(actor__optim__megatron={"lr": 1.0}),
            ["actor.optim.megatron.lr is set by DistFlow from optim.lr"],
        ),
        (
            dict(critic__optim__megatron={"optimizer_cpu_ofload": True}),
            ["critic.optim.megatron.optimizer_cpu_ofload"],
        ),
    ],
)
def test_config_refuses_unsupported_memory_options(overrides, words):
    with pytest.raises(ConfigError) as error:
        validate(_config(**overrides))
    for word in words:
        assert word in str(error.value), str(error.value)


def test_config_accepts_supported_memory_options():
    validate(
        _config(
            ref__offload=True,
            actor__optim__megatron={"optimizer_cpu_offload": True, "optimizer_offload_fraction": 1.0},
        )
    )
