"""The models the GPU check trains: Llama-shaped configs at about 1B and 3B parameters (and a tiny one for the
CPU smoke run), built by DistFlow's own MegatronWorker with Megatron's random initialisation.

A model directory here holds config.json and an empty model.safetensors: MegatronWorker reads the architecture
from it (the family spec, TransformerConfig, the local layer spec without Transformer Engine), and
`random_weights()` skips the HF weight load (hf_io.load_hf_weights), so no multi-GB checkpoint has to be
written or carried: the weights are Megatron's init_method draws.
"""

import contextlib
import json
from pathlib import Path
from unittest import mock

import torch
from safetensors.torch import save_file

from distflow.config.schema import ActorConfig, ModelConfig, OptimizerConfig, RefConfig
from distflow.workers.megatron import hf_io
from distflow.workers.megatron.worker import MegatronWorker

# name -> Llama 3.2's published shapes (1B: 1.24B parameters; 3B: 3.21B; both tie the embeddings).
SHAPES = {
    "1b": dict(hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192, vocab=128256),
    "3b": dict(hidden=3072, layers=28, heads=24, kv_heads=8, ffn=8192, vocab=128256),
    "tiny": dict(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=512),
}


def hf_config(size: str, max_positions: int) -> dict:
    s = SHAPES[size]
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": s["hidden"],
        "num_hidden_layers": s["layers"],
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"],
        "head_dim": s["hidden"] // s["heads"],
        "intermediate_size": s["ffn"],
        "vocab_size": s["vocab"],
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
    }


def write_model_dir(out: Path, size: str, max_positions: int) -> Path:
    """config.json + an empty model.safetensors (the weights come from Megatron's init: random_weights)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(hf_config(size, max_positions), indent=2))
    save_file({}, str(out / "model.safetensors"))
    return out


@contextlib.contextmanager
def random_weights():
    """MegatronWorker builds without loading HF weights: its parameters keep Megatron's random init."""
    with mock.patch.object(hf_io, "load_hf_weights", lambda *args, **kwargs: None):
        yield


def build_worker(role: str, model_dir: Path, layout, device: str, dtype: str, max_tokens: int, **options):
    """DistFlow's MegatronWorker ("actor": DDP + Megatron's Adam; "ref": forward only) with random weights.
    max_tokens: the token budget of one micro-batch (dynamic batching packs rows up to it)."""
    common = dict(use_dynamic_batch=True, max_tokens_per_micro_batch=max_tokens, **options)
    if role == "actor":
        role_cfg = ActorConfig(optim=OptimizerConfig(lr=1e-6), **common)
    else:
        role_cfg = RefConfig(**common)
    with random_weights():
        return MegatronWorker(role, role_cfg, ModelConfig(path=str(model_dir), dtype=dtype), layout, device)


def parameter_count(worker) -> dict:
    """Parameters of the model, and those that take part in matmuls per token (all but the embedding lookup;
    the tied output layer counts once, as the logits matmul)."""
    total = sum(p.numel() for chunk in worker.chunks for p in chunk.parameters())
    embedding = sum(
        chunk.embedding.word_embeddings.weight.numel() for chunk in worker.chunks if chunk.pre_process
    )
    tied = worker.chunks[-1].share_embeddings_and_output_weights
    return {"parameters": total, "matmul_parameters": total if tied else total - embedding}


def random_batch(rows: int, seq_len: int, vocab: int, device: torch.device, seed: int = 0) -> dict:
    """Right-padded rows of random tokens, lengths uniform in [seq_len / 2, seq_len], the first quarter of each
    row a prompt and the rest a response (MegatronWorker's batch format)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(seq_len // 2, seq_len + 1, (rows,), generator=gen)
    input_ids = torch.randint(1, vocab, (rows, seq_len), generator=gen)
    positions = torch.arange(seq_len).expand(rows, seq_len)
    attention_mask = (positions < lengths[:, None]).long()
    response_mask = ((positions >= (lengths // 4)[:, None]) & attention_mask.bool()).float()
    batch = {
        "input_ids": input_ids * attention_mask,
        "attention_mask": attention_mask,
        "response_mask": response_mask,
        "advantages": torch.randn(rows, 1, generator=gen).expand(rows, seq_len) * response_mask,
    }
    return {k: v.contiguous().to(device) for k, v in batch.items()}
