"""Maps a Hugging Face checkpoint's `architectures[0]` to the family spec that converts it."""

from distflow.models import llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe
from distflow.models.spec import DenseFamilySpec

SPECS: dict[str, DenseFamilySpec] = {
    m.SPEC.hf_architecture: m.SPEC for m in (llama, qwen2, qwen3, mistral, mixtral, qwen2_moe, qwen3_moe)
}
DENSE_FAMILIES = tuple(spec.family for spec in SPECS.values() if not spec.moe)
MOE_FAMILIES = tuple(spec.family for spec in SPECS.values() if spec.moe)


def spec_for(hf_config) -> DenseFamilySpec:
    """The spec for a transformers config object or config.json dict; fails naming what is supported."""
    architectures = (hf_config if isinstance(hf_config, dict) else hf_config.to_dict()).get(
        "architectures"
    ) or []
    assert architectures, "the HF config has no `architectures` entry to choose a model family by"
    spec = SPECS.get(architectures[0])
    assert spec is not None, f"no model family spec for {architectures[0]!r}; supported: {sorted(SPECS)}"
    return spec
