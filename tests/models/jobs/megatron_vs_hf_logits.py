"""Loads tiny HF models into Megatron GPTModel (local spec, TP = world size) and compares logits with HF.

Launched by torchrun from tests/models/test_megatron_conversion.py:
    torchrun --nproc-per-node TP megatron_vs_hf_logits.py --out RESULT.json DIR [DIR ...]
Per model, every rank builds its own shard with hf_to_megatron_shard and checks that it names and shapes
exactly the parameters GPTModel created. Rank 0 writes {model dir name: {"max_abs_diff", "max_abs_logit",
"roundtrip_exact"}}: the largest |Megatron logit - HF logit| over a fixed batch (and the logits' scale),
and whether the TP-gathered Megatron state converts back to the HF checkpoint bit for bit.
"""
import argparse
import json
import os

import torch
import torch.distributed as dist

SEED = 0
BATCH, SEQ_LEN = 2, 24


def build_megatron_model(spec, hf_config, tp_size: int):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(**spec.transformer_config_kwargs(
        hf_config, tensor_model_parallel_size=tp_size, use_cpu_initialization=True, params_dtype=torch.float32))
    fields = spec.gpt_model_fields(hf_config, tp_size)
    # parallel_output=False gathers the vocabulary-parallel logits, so every rank sees the full vocabulary.
    return GPTModel(config=config, transformer_layer_spec=fields["layer_spec"], vocab_size=fields["vocab_size"],
                    max_sequence_length=fields["max_sequence_length"], position_embedding_type="rope",
                    share_embeddings_and_output_weights=fields["tie_embeddings"],
                    rotary_base=fields["rotary_base"], rope_scaling=fields["rope_scaling"],
                    rope_scaling_factor=fields["rope_scaling_factor"], parallel_output=False).eval()


def load_shard(model, shard: dict) -> None:
    """Loads `shard`, first checking it has exactly GPTModel's parameter names and shapes."""
    expected = {n: tuple(t.shape) for n, t in model.state_dict().items() if not n.endswith("_extra_state")}
    got = {n: tuple(t.shape) for n, t in shard.items()}
    assert got == expected, f"shard differs from GPTModel's parameters:\n got {got}\n expected {expected}"
    missing, unexpected = model.load_state_dict(shard, strict=False)
    assert not unexpected and all(n.endswith("_extra_state") for n in missing), (missing, unexpected)


def compare(model_dir: str, tp_rank: int, tp_size: int) -> dict:
    from transformers import AutoModelForCausalLM

    from distflow.models.conversion import HFCheckpoint, hf_to_megatron_shard, megatron_full_to_hf, \
        megatron_shards_to_full
    from distflow.models.registry import spec_for

    ckpt = HFCheckpoint(model_dir)
    spec, vocab = spec_for(ckpt.config), ckpt.config["vocab_size"]
    model = build_megatron_model(spec, ckpt.config, tp_size)
    load_shard(model, hf_to_megatron_shard(spec, ckpt.config, ckpt.get, tp_rank=tp_rank, tp_size=tp_size))

    tokens = torch.randint(0, vocab, (BATCH, SEQ_LEN), generator=torch.Generator().manual_seed(SEED))
    positions = torch.arange(SEQ_LEN).expand(BATCH, SEQ_LEN)
    with torch.no_grad():
        megatron_logits = model(tokens, positions, attention_mask=None)[..., :vocab]
        hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        hf_logits = hf_model(tokens).logits
    max_abs_diff = (megatron_logits - hf_logits).abs().max().item()

    # The reverse direction from the real model's state: gather every TP rank's tensors, convert to HF.
    local = {n: t.detach().clone() for n, t in model.state_dict().items() if not n.endswith("_extra_state")}
    gathered = [None] * tp_size
    dist.all_gather_object(gathered, local)
    back = megatron_full_to_hf(spec, ckpt.config, megatron_shards_to_full(gathered, vocab))
    roundtrip_exact = sorted(back) == ckpt.names() and all(torch.equal(back[n], ckpt.get(n)) for n in back)
    return {"max_abs_diff": max_abs_diff, "max_abs_logit": hf_logits.abs().max().item(),
            "roundtrip_exact": roundtrip_exact}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("model_dirs", nargs="+")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    import megatron_patches

    megatron_patches.apply()
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    tp_size = dist.get_world_size()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp_size)
    torch.manual_seed(SEED)
    model_parallel_cuda_manual_seed(SEED)  # attention forks this RNG tracker even with dropout 0
    results = {}
    for model_dir in args.model_dirs:
        name = os.path.basename(os.path.normpath(model_dir))
        results[name] = compare(model_dir, parallel_state.get_tensor_model_parallel_rank(), tp_size)
        print(f"rank {dist.get_rank()} {name}: {results[name]}", flush=True)
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
