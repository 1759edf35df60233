"""Llama 3.1 "llama3" rope scaling: mapped to GPTModel(rope_scaling=True, rope_scaling_factor=...), Megatron's
logits equal transformers' at TP1 and TP2 over 512-token rows (long enough that the scaled frequencies turn:
the same weights with plain rope differ by ~1 in the logits), and rope settings Megatron cannot reproduce are
rejected naming the field and what is supported.
"""

import json
from pathlib import Path

import pytest

from distflow.models.hf_validation import InvalidHFCheckpoint, spec_or_error
from distflow.models.registry import spec_for
from distflow.models.tiny import make_tiny_model
from distflow.testing.launch import REPO_ROOT, torchrun

JOB = Path(__file__).parent / "jobs" / "parallel_vs_hf_logits.py"
MAX_ABS_DIFF = 1e-4  # fp32; measured 4.5e-6 with logits of magnitude ~5
LLAMA31_70B = json.loads((REPO_ROOT / "examples" / "model_configs" / "llama3.1-70b.json").read_text())


@pytest.fixture(scope="module")
def llama31_dirs(tmp_path_factory) -> list[Path]:
    """The tiny Llama 3.1 as transformers 5 writes it (`rope_parameters`), and a copy in the released
    checkpoints' format (`rope_scaling` next to a top-level `rope_theta`)."""
    root = tmp_path_factory.mktemp("llama31")
    new = make_tiny_model("llama", root / "llama31_rope_parameters", rope="llama3")
    released = make_tiny_model("llama", root / "llama31_rope_scaling", rope="llama3")
    config = json.loads((released / "config.json").read_text())
    config["rope_scaling"] = {k: v for k, v in config.pop("rope_parameters").items() if k != "rope_theta"}
    (released / "config.json").write_text(json.dumps(config, indent=2))
    return [new, released]


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2])
def test_llama31_megatron_logits_equal_hf(llama31_dirs, tp, tmp_path):
    out = tmp_path / "result.json"
    torchrun(JOB, nproc=tp, args=["--tp", tp, "--seq-len", 512, "--out", out, *llama31_dirs], timeout_s=300)
    results = json.loads(out.read_text())
    assert sorted(results) == sorted(d.name for d in llama31_dirs)
    for name, result in results.items():
        assert result["roundtrip_exact"], (name, result)
        assert result["max_abs_diff"] <= MAX_ABS_DIFF, (name, tp, result)
        assert result["unscaled_rope_diff"] > 100 * MAX_ABS_DIFF, (
            f"{name}: rope scaling has no visible effect"
        )


def test_released_llama31_config_maps_to_gpt_model_rope_scaling():
    fields = spec_for(LLAMA31_70B).gpt_model_fields(LLAMA31_70B, tp_size=8)
    assert fields["rope_scaling"] is True and fields["rope_scaling_factor"] == 8.0
    assert fields["rotary_base"] == 500000.0
    llama32 = {
        **LLAMA31_70B,
        "rope_scaling": {**LLAMA31_70B["rope_scaling"], "factor": 32.0},
    }  # Llama 3.2 1B/3B
    assert spec_for(llama32).gpt_model_fields(llama32, tp_size=1)["rope_scaling_factor"] == 32.0
    plain = {k: v for k, v in LLAMA31_70B.items() if k != "rope_scaling"}
    assert spec_for(plain).gpt_model_fields(plain, tp_size=1)["rope_scaling"] is False


UNSUPPORTED = {  # rope_scaling edit: words the error must contain
    "yarn": (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
        ["rope scaling 'yarn'", "supported rope types: ['default', 'llama3']"],
    ),
    "linear_old_spelling": ({"type": "linear", "factor": 2.0}, ["rope scaling 'linear'", "'llama3'"]),
    "llama3_low_freq": (
        {**LLAMA31_70B["rope_scaling"], "low_freq_factor": 2.0},
        [
            "rope_scaling.low_freq_factor=2.0 is not supported",
            "low_freq_factor=1.0",
            "high_freq_factor=4.0",
            "original_max_position_embeddings=8192",
            "any factor",
        ],
    ),
    "llama3_original_context": (
        {**LLAMA31_70B["rope_scaling"], "original_max_position_embeddings": 4096},
        ["rope_scaling.original_max_position_embeddings=4096 is not supported"],
    ),
    "llama3_no_factor": (
        {k: v for k, v in LLAMA31_70B["rope_scaling"].items() if k != "factor"},
        ["rope_scaling.factor=None must be a number >= 1"],
    ),
    "partial_rotary": ({"rope_type": "default", "partial_rotary_factor": 0.5}, ["partial_rotary_factor=0.5"]),
}


@pytest.mark.parametrize("case", list(UNSUPPORTED))
def test_unsupported_rope_settings_are_rejected_naming_the_field(case):
    rope_scaling, words = UNSUPPORTED[case]
    with pytest.raises(InvalidHFCheckpoint) as error:
        spec_or_error({**LLAMA31_70B, "rope_scaling": rope_scaling})
    for word in words:
        assert word in str(error.value), str(error.value)
