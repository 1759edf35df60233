"""The few numbers of a model that parallel layouts are validated against, read from a HF config.json."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    num_heads: int
    num_kv_heads: int
    hidden_size: int
    vocab_size: int
    num_experts: int = 0  # 0 for dense models
    architecture: Optional[str] = None

    @classmethod
    def from_hf_config(cls, config: dict, source: str = "config.json") -> "ModelShape":
        def need(key):
            if key not in config:
                raise ValueError(f"{source} has no {key!r}, which every supported architecture defines")
            return int(config[key])

        heads = need("num_attention_heads")
        experts = (
            config.get("num_local_experts") or config.get("num_experts") or 0
        )  # mixtral / qwen-moe names
        archs = config.get("architectures") or [None]
        return cls(
            num_layers=need("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            hidden_size=need("hidden_size"),
            vocab_size=need("vocab_size"),
            num_experts=int(experts),
            architecture=archs[0],
        )

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> "ModelShape":
        config_file = Path(path) / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(
                f"model.path={path}: no config.json there (expected a Hugging Face model dir)"
            )
        return cls.from_hf_config(json.loads(config_file.read_text()), str(config_file))
