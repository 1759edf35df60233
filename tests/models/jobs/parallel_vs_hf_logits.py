"""Loads HF models (dense or MoE) into Megatron GPTModel at any TP/PP/EP/ETP layout and compares logits with HF.

Launched by torchrun from tests/models (world size = tp * pp * dp, where dp = ep * etp / tp or 1):
    torchrun --nproc-per-node N parallel_vs_hf_logits.py --tp T --pp P --ep E [--seq-len L] --out RESULT.json DIR ...
Weights come from the HF directory through hf_to_megatron_shard (each rank reads its own slices), or with
--load-megatron CKPT [CKPT ...] (one per DIR) from dist checkpoints written by tools/convert_hf_to_megatron.py
in another layout (DIR is then the HF model it came from, for the reference logits). The forward runs stage by stage
(activations sent over gloo between pipeline stages). Global rank 0 writes {model dir name:
{"max_abs_diff", "max_abs_logit", "roundtrip_exact"}}: the largest |Megatron - HF| logit over a fixed
batch, and whether the gathered Megatron state (every TP/ETP/EP/PP shard) converts back to the HF
checkpoint bit for bit; for rope-scaled models also "unscaled_rope_diff", the largest difference from HF
with plain rope (how large an unmapped rope scaling would show); with --load-megatron also
"identical_to_hf_load": whether the logits equal, bit for bit, those of the same layout loaded from HF.
Several layouts over the same ranks in one launch (the ranks' start-up paid once): their argument lists
separated by --then, each with its own --out; each layout builds its
Megatron groups and seeds its RNGs afresh, as a launch of its own would.
"""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

SEED = 0
BATCH = 2
THEN = "--then"  # separates the argument lists of several layouts compared in one launch


def pipeline_forward(model, tokens: torch.Tensor) -> torch.Tensor | None:
    """Full-vocabulary logits [batch, seq, padded vocab] on the last stage (None elsewhere)."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    batch, seq_len = tokens.shape
    positions = torch.arange(seq_len).expand(batch, seq_len)
    hidden = model.config.hidden_size
    if not ps.is_pipeline_first_stage():
        received = torch.empty(seq_len, batch, hidden)
        dist.recv(received, src=ps.get_pipeline_model_parallel_prev_rank())
        model.set_input_tensor(received)
    with torch.no_grad():
        output = model(tokens, positions, attention_mask=None)
    if not ps.is_pipeline_last_stage():
        dist.send(output.contiguous(), dst=ps.get_pipeline_model_parallel_next_rank())
        return None
    return gather_from_tensor_model_parallel_region(output)


def my_state_and_place(model, layer_offset: int) -> tuple:
    from megatron.core import parallel_state as ps

    place = dict(
        pp=ps.get_pipeline_model_parallel_rank(),
        tp=ps.get_tensor_model_parallel_rank(),
        dp=ps.get_data_parallel_rank(),
        ep=ps.get_expert_model_parallel_rank(),
        etp=ps.get_expert_tensor_parallel_rank(),
        edp=ps.get_expert_data_parallel_rank(),
        offset=layer_offset,
    )
    state = {n: t.detach().clone() for n, t in model.state_dict().items() if not n.endswith("_extra_state")}
    return place, state


def gathered_to_hf(spec, cfg: dict, gathered: list) -> dict:
    """HF tensors from every rank's (place, state): TP-unshard the dense part, ETP-unshard then EP-merge the
    experts, stage by stage."""
    from distflow.models.conversion import megatron_full_to_hf, megatron_shards_to_full, merge_expert_parallel
    from distflow.models.tp_sharding import is_expert_param

    hf = {}
    for pp in sorted({place["pp"] for place, _ in gathered}):
        stage = [(p, s) for p, s in gathered if p["pp"] == pp]
        dense = sorted(
            (p["tp"], {n: t for n, t in s.items() if not is_expert_param(n)})
            for p, s in stage
            if p["dp"] == 0
        )
        full = megatron_shards_to_full([s for _, s in dense], cfg["vocab_size"])
        by_ep = {}
        for p, s in stage:
            if p["edp"] == 0:
                by_ep.setdefault(p["ep"], {})[p["etp"]] = {n: t for n, t in s.items() if is_expert_param(n)}
        if any(by_ep[0].values()):
            per_ep = [
                megatron_shards_to_full([by_etp[r] for r in sorted(by_etp)], cfg["vocab_size"])
                for _, by_etp in sorted(by_ep.items())
            ]
            full.update(merge_expert_parallel(per_ep))
        hf.update(megatron_full_to_hf(spec, cfg, full, layer_offset=stage[0][0]["offset"]))
    if cfg.get("tie_word_embeddings"):
        hf.pop("lm_head.weight", None)
    return hf


def compare(model_dir: str, megatron_dir: str | None, args) -> dict | None:
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset
    from transformers import AutoModelForCausalLM

    from distflow.models.checkpoint_import import (
        CheckpointLayout,
        build_stage_models,
        load_hf_into_chunks,
        read_source,
    )
    from distflow.models.conversion import HFCheckpoint
    from distflow.models.registry import spec_for
    from distflow.models.spec import rope_type
    from distflow.models.tp_sharding import padded_vocab_size

    ckpt = HFCheckpoint(model_dir)
    cfg, spec = ckpt.config, spec_for(ckpt.config)
    layout = CheckpointLayout(tp=args.tp, pp=args.pp, ep=args.ep, etp=args.etp)
    padded = (
        read_source(megatron_dir)["padded_vocab_size"]
        if megatron_dir
        else padded_vocab_size(cfg["vocab_size"], args.tp)
    )
    moe = dict(moe_token_dispatcher_type=args.dispatcher) if spec.moe else {}
    (model,) = build_stage_models(spec, cfg, layout, padded, torch.float32, initialize=True, **moe)
    model.eval()
    if megatron_dir:
        model.load_state_dict(dist_checkpointing.load(model.sharded_state_dict(), megatron_dir))
    else:
        load_hf_into_chunks([model], spec, ckpt, padded)

    tokens = torch.randint(
        0, cfg["vocab_size"], (BATCH, args.seq_len), generator=torch.Generator().manual_seed(SEED)
    )
    result = {}
    logits = pipeline_forward(model, tokens)
    if megatron_dir:
        # The same layout loaded straight from HF: a checkpoint saved at another layout must give the
        # very same logits, bit for bit.
        (direct,) = build_stage_models(spec, cfg, layout, padded, torch.float32, initialize=True, **moe)
        load_hf_into_chunks([direct.eval()], spec, ckpt, padded)
        direct_logits = pipeline_forward(direct, tokens)
        if direct_logits is not None:
            result["identical_to_hf_load"] = torch.equal(logits, direct_logits)
    if logits is not None and ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0:
        logits = logits[..., : cfg["vocab_size"]]
        with torch.no_grad():
            hf_logits = (
                AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()(tokens).logits
            )
        result.update(
            max_abs_diff=(logits - hf_logits).abs().max().item(), max_abs_logit=hf_logits.abs().max().item()
        )
        if rope_type(cfg) != "default":
            # How far the same weights without the rope scaling are: shows the comparison can fail.
            result["unscaled_rope_diff"] = (
                (logits - unscaled_rope_logits(model_dir, tokens)).abs().max().item()
            )

    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(
        gathered, (my_state_and_place(model, get_transformer_layer_offset(model.config)), result)
    )
    if dist.get_rank() != 0:
        return None
    merged = {k: v for _, r in gathered for k, v in r.items()}
    identical = [r["identical_to_hf_load"] for _, r in gathered if "identical_to_hf_load" in r]
    if identical:  # every last-stage rank's logits
        merged["identical_to_hf_load"] = all(identical)
    back = gathered_to_hf(spec, cfg, [placed for placed, _ in gathered])
    merged["roundtrip_exact"] = sorted(back) == ckpt.names() and all(
        torch.equal(back[n], ckpt.get(n)) for n in back
    )
    return merged


def unscaled_rope_logits(model_dir: str, tokens: torch.Tensor) -> torch.Tensor:
    """HF logits of the same checkpoint with plain rope (same rope_theta, no scaling)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    config.rope_parameters = {"rope_type": "default", "rope_theta": config.rope_parameters["rope_theta"]}
    with torch.no_grad():
        return (
            AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=torch.float32)
            .eval()(tokens)
            .logits
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--ep", type=int, default=1)
    parser.add_argument("--etp", type=int, default=None)
    parser.add_argument("--dispatcher", default="alltoall", choices=["alltoall", "allgather"])
    parser.add_argument(
        "--load-megatron",
        nargs="*",
        default=[],
        help="dist checkpoints to load instead of the HF weights, one per model dir",
    )
    parser.add_argument("--seq-len", type=int, default=24, help="tokens per row of the compared batch")
    parser.add_argument("--out", required=True)
    parser.add_argument("model_dirs", nargs="+")
    runs = [parser.parse_args(part) for part in split_runs(sys.argv[1:])]
    for args in runs:
        assert not args.load_megatron or len(args.load_megatron) == len(args.model_dirs), (
            "one checkpoint per dir"
        )

    dist.init_process_group("gloo")
    import megatron_patches

    megatron_patches.apply()
    for args in runs:
        compare_layout(args)
    dist.destroy_process_group()


def split_runs(argv: list[str]) -> list[list[str]]:
    """The argument lists of the layouts to compare, separated by THEN."""
    parts = [[]]
    for arg in argv:
        if arg == THEN:
            parts.append([])
        else:
            parts[-1].append(arg)
    return parts


def compare_layout(args) -> None:
    """One layout's comparison of every model dir: Megatron's groups and the RNGs set up afresh, as in a job of
    its own; global rank 0 writes args.out."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=args.tp,
        pipeline_model_parallel_size=args.pp,
        expert_model_parallel_size=args.ep,
        expert_tensor_parallel_size=args.etp,
    )
    torch.manual_seed(SEED)
    model_parallel_cuda_manual_seed(SEED)  # attention forks this RNG tracker even with dropout 0
    results = {}
    for i, model_dir in enumerate(args.model_dirs):
        name = os.path.basename(os.path.normpath(model_dir))
        result = compare(model_dir, args.load_megatron[i] if args.load_megatron else None, args)
        if result is not None:
            results[name] = result
            print(f"{name} tp{args.tp} pp{args.pp} ep{args.ep} etp{args.etp}: {result}", flush=True)
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    parallel_state.destroy_model_parallel()


if __name__ == "__main__":  # dist_checkpointing may start processes by spawn, which re-imports __main__
    main()
