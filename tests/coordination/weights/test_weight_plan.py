"""The weight-sync plan without processes: assembling every engine rank's tensors from the plan's pieces of
Megatron shards (built by the HF -> Megatron conversion, as the trainer holds them) gives exactly what
SGLang's loaders make of the full HF tensors, for TP/PP/VPP/DP training layouts and engine TP 1/2/4
(KV heads split and replicated, vocabulary padding on both sides), and for the MoE families (fused w13/w2
experts, router, shared expert) from EP/ETP/expert-DP layouts, each expert from its EP owner; each engine
rank receives only its slice; replicas share the sending; buckets respect the bound and mix pipeline
stages."""

import pytest
import torch

from distflow.coordination.weights import plan as wplan
from distflow.coordination.weights.megatron_names import global_name
from distflow.coordination.weights.regions import narrow
from distflow.coordination.weights.resharder import planned_writes
from distflow.coordination.weights.sglang_layout import Dims, hf_tensor_shape, sglang_padded_vocab
from distflow.layout import ParallelLayout, Placement
from distflow.models import conversion, tp_sharding, weight_mapping
from distflow.models.registry import SPECS

QWEN2 = SPECS["Qwen2ForCausalLM"]
LLAMA = SPECS["LlamaForCausalLM"]
QWEN3 = SPECS["Qwen3ForCausalLM"]
MIXTRAL = SPECS["MixtralForCausalLM"]
QWEN2_MOE = SPECS["Qwen2MoeForCausalLM"]
QWEN3_MOE = SPECS["Qwen3MoeForCausalLM"]


def config(arch, *, layers=4, hidden=32, heads=4, kv=2, ffn=48, vocab=300, tied=False, head_dim=None):
    cfg = dict(
        architectures=[arch],
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=ffn,
        vocab_size=vocab,
        tie_word_embeddings=tied,
        rms_norm_eps=1e-6,
        max_position_embeddings=128,
        rope_theta=10000.0,
    )
    if head_dim:
        cfg["head_dim"] = head_dim
    return cfg


def moe_config(arch, *, experts=4, shared=False, **kw):
    cfg = config(arch, **kw)
    cfg.update(
        num_local_experts=experts, num_experts=experts, num_experts_per_tok=2, moe_intermediate_size=24
    )
    if shared:
        cfg["shared_expert_intermediate_size"] = 40
    return cfg


def hf_state(spec, cfg, seed=0):
    gen = torch.Generator().manual_seed(seed)
    names = [hf for rule in weight_mapping.param_rules(spec, cfg) if rule.exported for hf in rule.hf]
    return {n: torch.randn(hf_tensor_shape(spec, cfg, n), generator=gen) for n in names}


def megatron_shards(spec, cfg, hf, train: ParallelLayout) -> dict[int, dict[str, torch.Tensor]]:
    """Global rank -> {global Megatron name: local shard}, as each training rank holds them. Expert ranks
    within a stage: etp fastest, then ep (Megatron's expert rank generator)."""
    layers = cfg["num_hidden_layers"]
    per_chunk = layers // (train.pp * train.vpp)
    experts_per_rank = (cfg.get("num_experts") or 0) // train.ep if spec.moe else 0
    out = {}
    for rank in range(train.world_size):
        c = train.coords(rank)
        in_stage = rank % (train.world_size // train.pp)
        etp, ep = in_stage % train.etp, in_stage // train.etp % train.ep
        state = {}
        for vp in range(train.vpp):
            offset = (vp * train.pp + c.pp) * per_chunk
            shard = conversion.hf_to_megatron_shard(
                spec,
                cfg,
                hf.__getitem__,
                tp_rank=c.tp,
                tp_size=train.tp,
                layer_offset=offset,
                num_layers=per_chunk,
                pre_process=c.pp == 0 and vp == 0,
                post_process=c.pp == train.pp - 1 and vp == train.vpp - 1,
                ep_rank=ep,
                ep_size=train.ep,
                etp_rank=etp,
                etp_size=train.etp,
            )
            state.update({global_name(n, offset, ep * experts_per_rank): t for n, t in shard.items()})
        out[rank] = state
    return out


def assemble(plan, engine, rank, shards, dtype=torch.float32):
    """Every engine parameter of one engine rank, written from the plan's pieces (row ranges of a parameter
    the plan split over buckets land at their offsets)."""
    out = {}
    for t in plan.engines[engine][0 if plan.shared else rank].targets:
        buf = out.setdefault(t.param_name, torch.zeros(t.param_shape, dtype=dtype))
        for p in t.pieces:
            narrow(buf, t.in_param(p.dst)).copy_(narrow(shards[p.src_rank][p.src_name], p.src))
    return out


def sglang_reference(spec, cfg, hf, tp, r):
    """What SGLang's own loaders make of the full HF tensors on rank r of tp (written independently)."""
    d = Dims.of(cfg)
    vs = sglang_padded_vocab(d.vocab, tp)

    def vocab(w):
        return torch.cat([w, w.new_zeros(vs - d.vocab, d.hidden)]).chunk(tp)[r]

    def kv_part(w):
        return w.chunk(d.kv_heads)[r // (tp // d.kv_heads)] if tp >= d.kv_heads else w.chunk(tp)[r]

    out = {"model.embed_tokens.weight": vocab(hf["model.embed_tokens.weight"])}
    for i in range(d.layers):
        p, a, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        out[p + "input_layernorm.weight"] = hf[p + "input_layernorm.weight"]
        out[p + "post_attention_layernorm.weight"] = hf[p + "post_attention_layernorm.weight"]
        for kind in ("weight", "bias") if spec.qkv_bias else ("weight",):
            q, k, v = (hf[a + f"{x}_proj.{kind}"] for x in "qkv")
            out[a + f"qkv_proj.{kind}"] = torch.cat([q.chunk(tp)[r], kv_part(k), kv_part(v)])
        if spec.qk_layernorm:
            out[a + "q_norm.weight"], out[a + "k_norm.weight"] = (
                hf[a + "q_norm.weight"],
                hf[a + "k_norm.weight"],
            )
        out[a + "o_proj.weight"] = hf[a + "o_proj.weight"].chunk(tp, dim=1)[r]
        if spec.moe:
            out.update(sglang_moe_reference(spec, cfg, hf, tp, r, i))
            continue
        out[m + "gate_up_proj.weight"] = torch.cat(
            [hf[m + "gate_proj.weight"].chunk(tp)[r], hf[m + "up_proj.weight"].chunk(tp)[r]]
        )
        out[m + "down_proj.weight"] = hf[m + "down_proj.weight"].chunk(tp, dim=1)[r]
    out["model.norm.weight"] = hf["model.norm.weight"]
    if not d.tied:
        out["lm_head.weight"] = vocab(hf["lm_head.weight"])
    return out


def sglang_moe_reference(spec, cfg, hf, tp, r, layer):
    """SGLang's FusedMoE loading (weight_loader w1/w3 -> w13 halves, w2 columns) of one layer's MoE block."""
    b = f"model.layers.{layer}.{spec.hf_moe_block}."
    gate, up, down = spec.hf_expert_projections
    experts = range(cfg["num_experts"])
    out = {
        b + "gate.weight": hf[b + "gate.weight"],
        b + "experts.w13_weight": torch.stack(
            [
                torch.cat(
                    [
                        hf[f"{b}experts.{e}.{gate}.weight"].chunk(tp)[r],
                        hf[f"{b}experts.{e}.{up}.weight"].chunk(tp)[r],
                    ]
                )
                for e in experts
            ]
        ),
        b + "experts.w2_weight": torch.stack(
            [hf[f"{b}experts.{e}.{down}.weight"].chunk(tp, dim=1)[r] for e in experts]
        ),
    }
    if spec.shared_expert:
        s = b + "shared_expert."
        out[s + "gate_up_proj.weight"] = torch.cat(
            [hf[s + "gate_proj.weight"].chunk(tp)[r], hf[s + "up_proj.weight"].chunk(tp)[r]]
        )
        out[s + "down_proj.weight"] = hf[s + "down_proj.weight"].chunk(tp, dim=1)[r]
        out[b + "shared_expert_gate.weight"] = hf[b + "shared_expert_gate.weight"]
    return out


CASES = [  # (spec, config kwargs, train layout kwargs, world, engine_tp)
    (QWEN2, dict(tied=True), dict(tp=1), 1, 1),
    (QWEN2, dict(tied=True), dict(tp=2), 2, 1),
    (QWEN2, dict(tied=True), dict(pp=2), 2, 1),
    (QWEN2, dict(tied=True), dict(tp=2), 2, 2),
    (QWEN2, dict(tied=True, kv=1), dict(pp=2), 2, 2),  # KV heads replicated over engine ranks
    (LLAMA, dict(), dict(tp=2, pp=2), 4, 4),  # 2 KV heads over 4 engine ranks
    (LLAMA, dict(), dict(tp=2, pp=2, vpp=2), 8, 2),  # dp 2: two engines fed by the two replicas
    (LLAMA, dict(vocab=512), dict(tp=4), 4, 1),
    (QWEN3, dict(head_dim=16), dict(tp=2), 2, 2),  # q/k norms, head_dim != hidden / heads
    (QWEN2, dict(tied=True, layers=2), dict(tp=1), 4, 2),  # dp 4, two engines
]
MOE_CASES = [  # (spec, moe config kwargs, train layout kwargs, world, engine_tp)
    (MIXTRAL, dict(), dict(ep=2), 2, 1),  # experts from their EP owners into one engine rank
    (MIXTRAL, dict(), dict(ep=2), 2, 2),
    (MIXTRAL, dict(experts=8), dict(tp=2, ep=2, etp=1), 4, 2),  # dense TP 2, experts whole (ETP 1)
    (QWEN3_MOE, dict(head_dim=16), dict(tp=2, ep=2), 4, 2),  # experts split over ETP 2
    (QWEN3_MOE, dict(head_dim=16), dict(tp=1), 2, 2),  # dp 2: every rank holds every expert
    (QWEN2_MOE, dict(shared=True), dict(tp=2, pp=2, ep=2), 8, 2),  # + shared expert
    (QWEN2_MOE, dict(shared=True), dict(ep=2), 4, 2),  # expert-DP 2: two engines, two replicas
    (QWEN2_MOE, dict(shared=True, kv=4), dict(ep=2), 4, 4),  # an expert's FFN over 4 engine ranks
]


def shard_plan(spec, cfg, train_kw, world, engine_tp):
    """(train layout, colocated placement, HF tensors, Megatron shards, shard-level plan) for one case."""
    train = ParallelLayout.for_world(world, **train_kw)
    placement = Placement.create("colocated", world, engine_tp)
    hf = hf_state(spec, cfg)
    shards = megatron_shards(spec, cfg, hf, train)
    plan = wplan.plan_weight_sync(spec, cfg, train, placement, bucket_bytes=4096, element_size=4)
    assert plan.mode == wplan.SHARDS
    return train, placement, hf, shards, plan


@pytest.mark.parametrize("spec,cfg_kw,train_kw,world,engine_tp", CASES)
def test_assembled_shards_equal_sglang_loading(spec, cfg_kw, train_kw, world, engine_tp):
    cfg = config(spec.hf_architecture, **cfg_kw)
    train, placement, hf, shards, plan = shard_plan(spec, cfg, train_kw, world, engine_tp)
    for e in range(placement.num_engines):
        for r in range(engine_tp):
            got = assemble(plan, e, r, shards)
            want = sglang_reference(spec, cfg, hf, engine_tp, r)
            assert sorted(got) == sorted(want)
            for name in want:
                assert torch.equal(got[name], want[name]), (e, r, name)
            # each engine rank receives exactly its slice: the bytes of its own parameters, nothing more
            assert plan.receiver_bytes(e, r) == 4 * sum(t.numel() for t in want.values())


@pytest.mark.parametrize("spec,cfg_kw,train_kw,world,engine_tp", MOE_CASES)
def test_moe_shards_equal_sglang_fused_expert_loading(spec, cfg_kw, train_kw, world, engine_tp):
    """Every engine parameter (fused w13/w2, router, shared expert, attention) is covered exactly once,
    equals SGLang's own loading of the HF tensors, and each routed expert comes from its EP owner."""
    cfg = moe_config(spec.hf_architecture, **cfg_kw)
    train, placement, hf, shards, plan = shard_plan(spec, cfg, train_kw, world, engine_tp)
    per_ep = cfg["num_experts"] // train.ep
    for e in range(placement.num_engines):
        for r in range(engine_tp):
            targets = plan.engines[e][r].targets
            for t in targets:  # exactly once: the pieces tile the target without overlap
                hits = torch.zeros(t.shape, dtype=torch.int32)
                for p in t.pieces:
                    narrow(hits, p.dst).add_(1)
                assert int(hits.max()) <= 1 and (bool((hits == 1).all()) or t.padding_rows), t.name
            got = assemble(plan, e, r, shards)
            want = sglang_reference(spec, cfg, hf, engine_tp, r)
            assert sorted(got) == sorted(want)
            for name in want:
                assert torch.equal(got[name], want[name]), (e, r, name)
            assert plan.receiver_bytes(e, r) == 4 * sum(t.numel() for t in want.values())
            for t in targets:
                for p in t.pieces:
                    if ".local_experts." in p.src_name:
                        expert = int(p.src_name.split(".local_experts.")[1].split(".")[0])
                        in_stage = placement.train_ranks.index(p.src_rank) % (train.world_size // train.pp)
                        assert in_stage // train.etp % train.ep == expert // per_ep, (p.src_rank, p.src_name)
    fallback = wplan.plan_weight_sync(
        spec, cfg, train, placement, bucket_bytes=4096, element_size=4, mode="hf"
    )
    if engine_tp > 1:  # each rank receives its slice, not the full model
        assert plan.receiver_bytes(0, 0) < fallback.receiver_bytes(0, 0)


@pytest.mark.parametrize(
    "arch,cfg_kw,train_kw,world",
    [
        ("Qwen2ForCausalLM", dict(tied=True), dict(tp=2, pp=2), 4),
        ("LlamaForCausalLM", dict(), dict(tp=2), 2),
        ("MixtralForCausalLM", dict(moe=True), dict(ep=2), 2),  # experts sent by their EP owners
        ("Qwen3MoeForCausalLM", dict(moe=True, head_dim=16), dict(tp=2, ep=2), 4),  # experts split over ETP 2
        ("Qwen2MoeForCausalLM", dict(moe=True, shared=True), dict(tp=2, pp=2, ep=2), 8),  # + shared expert
        ("Qwen2MoeForCausalLM", dict(moe=True, shared=True), dict(ep=2), 4),  # expert-DP 2
    ],
)
def test_hf_fallback_assembles_full_hf_tensors(arch, cfg_kw, train_kw, world):
    spec = SPECS[arch]
    kw = {k: v for k, v in cfg_kw.items() if k != "moe"}
    cfg = moe_config(arch, **kw) if cfg_kw.get("moe") else config(arch, **kw)
    train = ParallelLayout.for_world(world, **train_kw)
    hf = hf_state(spec, cfg)
    plan = wplan.plan_weight_sync(
        spec,
        cfg,
        train,
        Placement.create("colocated", world, 2),
        bucket_bytes=1 << 20,
        element_size=4,
        mode="hf",
    )
    got = assemble(plan, 0, 0, megatron_shards(spec, cfg, hf, train))
    assert list(got) == list(hf)
    assert all(torch.equal(got[n], hf[n]) for n in hf)
    assert plan.receiver_bytes(0, 1) == plan.receiver_bytes(0, 0) == 4 * sum(t.numel() for t in hf.values())


def test_pieces_read_only_what_the_sender_holds():
    """Every piece names a tensor its sender holds, inside its local shape: no rank reads another's shard."""
    spec, cfg = LLAMA, config("LlamaForCausalLM")
    train = ParallelLayout.for_world(4, tp=2, pp=2)
    shards = megatron_shards(spec, cfg, hf_state(spec, cfg), train)
    plan = wplan.plan_weight_sync(spec, cfg, train, Placement.create("colocated", 4, 2), bucket_bytes=4096)
    for ranks in plan.engines:
        for rp in ranks:
            for t in rp.targets:
                for p in t.pieces:
                    local = shards[p.src_rank][p.src_name]
                    assert all(s + n <= dim for (s, n), dim in zip(p.src, local.shape)), (p, local.shape)


def test_replicas_share_the_sending_and_stages_send_in_parallel():
    spec, cfg = QWEN2, config("Qwen2ForCausalLM", tied=True)
    train = ParallelLayout.for_world(4, pp=2)  # dp 2
    plan = wplan.plan_weight_sync(
        spec, cfg, train, Placement.create("colocated", 4, 1), bucket_bytes=24576, element_size=2
    )
    sent = plan.sender_bytes()
    assert set(sent) == {0, 1, 2, 3}  # engines 0..3 read from replicas 0, 1, 0, 1: every rank sends
    stage_of = {t.name: t.stage for t in plan.engines[0][0].targets}
    assert len(plan.buckets) > 2
    for names in plan.buckets[:-1]:  # the last may hold a stage's remainder
        assert {stage_of[n] for n in names} == {0, 1}, names


def test_buckets_respect_the_bound_and_cover_every_tensor_once():
    spec, cfg = LLAMA, config("LlamaForCausalLM")
    train = ParallelLayout.for_world(2, tp=2)
    bound = 1024  # below the embedding's (160 x 32 x 2 B per engine rank) and the MLP's sizes
    plan = wplan.plan_weight_sync(
        spec, cfg, train, Placement.create("colocated", 2, 2), bucket_bytes=bound, element_size=2
    )
    names = [n for b in plan.buckets for n in b]
    assert sorted(names) == sorted(t.name for t in plan.engines[0][0].targets)
    for b in range(len(plan.buckets)):
        for r in range(2):
            assert sum(t.numel * 2 for t in plan.bucket_targets(b, 0, r)) <= bound
    embed = [t for t in plan.engines[0][1].targets if t.param_name == "model.embed_tokens.weight"]
    # 16 rows of 32 elements (1 KiB) per range; padding rows 140..159 stay zero-filled in the last two
    assert [(t.name, t.row_offset, t.shape) for t in embed[:2]] == [
        ("model.embed_tokens.weight[0:16]", 0, (16, 32)),
        ("model.embed_tokens.weight[16:32]", 16, (16, 32)),
    ]
    assert [t.padding_rows for t in embed[-3:]] == [None, (12, 4), (0, 16)]
    assert plan.engines[0][1].param_shapes["model.embed_tokens.weight"] == (160, 32)


def test_a_row_larger_than_the_bound_travels_alone():
    """Stacked experts [E, 2f, h] are cut between experts; one expert above the bound is a range of one row."""
    spec, cfg = MIXTRAL, moe_config("MixtralForCausalLM")
    plan = wplan.plan_weight_sync(
        spec,
        cfg,
        ParallelLayout.for_world(2, ep=2),
        Placement.create("colocated", 2, 1),
        bucket_bytes=4 * 96 * 32 - 4,
        element_size=4,
    )  # one expert's w13: 2 x 48 rows
    w13 = [
        t
        for t in plan.engines[0][0].targets
        if t.param_name == "model.layers.0.block_sparse_moe.experts.w13_weight"
    ]
    assert [t.shape for t in w13] == [(1, 96, 32)] * 4
    assert [len(t.pieces) for t in w13] == [2] * 4  # gate rows and up rows of one expert, from its EP owner


def test_megatron_vocab_padding_differs_from_sglangs():
    """300 tokens: Megatron pads to 512 at TP2 (256 per rank), SGLang to 320 at TP2 (160 per rank)."""
    spec, cfg = LLAMA, config("LlamaForCausalLM", vocab=300)
    assert tp_sharding.padded_vocab_size(300, 2) == 512 and sglang_padded_vocab(300, 2) == 320
    plan = wplan.plan_weight_sync(
        spec,
        cfg,
        ParallelLayout.for_world(2, tp=2),
        Placement.create("colocated", 2, 2),
        bucket_bytes=1 << 20,
    )
    embed = plan.engines[0][1].by_name["model.embed_tokens.weight"]
    assert embed.shape == (160, 32) and embed.padding_rows == (140, 20)
    # rows 160..299 of the vocabulary: 96 from Megatron TP rank 0 (rows 160..255), 44 from rank 1
    assert [(p.src_rank, p.src[0], p.dst[0]) for p in embed.pieces] == [
        (0, (160, 96), (0, 96)),
        (1, (0, 44), (96, 44)),
    ]


def test_cpu_engines_that_pad_take_the_hf_fallback():
    """SGLang's CPU engine pads KV heads that do not split over its TP and MLP widths to 32 * TP."""
    kv1 = config("LlamaForCausalLM", kv=1, ffn=64)
    assert wplan.sync_mode(LLAMA, "auto", kv1, engine_tp=2, engine_device="cpu") == wplan.HF
    assert (
        wplan.sync_mode(LLAMA, "auto", kv1, engine_tp=2, engine_device="cuda") == wplan.SHARDS
    )  # replicated
    ffn48 = config("LlamaForCausalLM", ffn=48)
    assert wplan.sync_mode(LLAMA, "auto", ffn48, engine_tp=1, engine_device="cpu") == wplan.HF
    ffn64 = config("LlamaForCausalLM", ffn=64)
    assert wplan.sync_mode(LLAMA, "auto", ffn64, engine_tp=2, engine_device="cpu") == wplan.SHARDS
    # MoE: the experts' and the shared expert's widths are padded too
    moe = moe_config("Qwen2MoeForCausalLM", ffn=64, shared=True)  # moe_intermediate_size 24, shared 40
    assert "moe_intermediate_size 24" in wplan.sglang_layout.cpu_engine_pads(moe, 1)
    assert wplan.sync_mode(QWEN2_MOE, "auto", moe, engine_tp=1, engine_device="cpu") == wplan.HF
    moe.update(moe_intermediate_size=64)
    assert "shared_expert_intermediate_size 40" in wplan.sglang_layout.cpu_engine_pads(moe, 2)
    moe.update(shared_expert_intermediate_size=128)
    assert wplan.sync_mode(QWEN2_MOE, "auto", moe, engine_tp=2, engine_device="cpu") == wplan.SHARDS


def test_unsupported_layouts_fail_clearly():
    spec, cfg = QWEN2, config("Qwen2ForCausalLM", heads=4, kv=2)
    with pytest.raises(ValueError, match="engine_tp=3"):
        wplan.plan_weight_sync(
            spec, cfg, ParallelLayout.for_world(3), Placement.create("colocated", 3, 3), bucket_bytes=1024
        )
    assert wplan.sync_mode(MIXTRAL) == wplan.SHARDS
    assert wplan.sync_mode(MIXTRAL, "hf") == wplan.HF
    with pytest.raises(ValueError, match="intermediate_size=50 does not split over engine_tp=4"):
        wplan.plan_weight_sync(
            MIXTRAL,
            moe_config("MixtralForCausalLM", kv=4, ffn=50),
            ParallelLayout.for_world(4),
            Placement.create("colocated", 4, 4),
            bucket_bytes=1024,
        )


def test_each_rank_writes_its_own_bytes_and_every_staged_element_is_written_once():
    """resharder.planned_writes, what each rank copies into the staging buffers: its sender bytes, and over all
    ranks every element of every bucket's targets exactly once, but the padding rows its host zeroes."""
    spec, cfg = LLAMA, config("LlamaForCausalLM")
    train = ParallelLayout.for_world(4, tp=2, pp=2)
    plan = wplan.plan_weight_sync(
        spec, cfg, train, Placement.create("colocated", 4, 2), bucket_bytes=4096, element_size=2
    )
    counts = {
        (b, e, r): torch.zeros(sum(t.numel for t in plan.bucket_targets(b, e, r)), dtype=torch.int32)
        for b in range(len(plan.buckets))
        for e, ranks in enumerate(plan.engines)
        for r in range(len(ranks))
    }
    padded = 0
    for rank in range(4):
        writes, zero_fills = planned_writes(plan, rank)
        written = sum(piece.numel * 2 for items in writes.values() for *_, piece in items)
        assert written == plan.sender_bytes().get(rank, 0), rank
        for b, items in writes.items():
            for e, r, target, offset, piece in items:
                staged = counts[(b, e, r)][offset : offset + target.numel].view(target.shape)
                narrow(staged, piece.dst).add_(1)
        for b, fills in zero_fills.items():
            for e, r, target, offset in fills:
                start, rows = target.padding_rows
                row = target.numel // target.shape[0]
                counts[(b, e, r)][offset + start * row : offset + (start + rows) * row] -= 1
                padded += rows * row
    assert padded > 0  # the vocabulary's padding rows (test_buckets_respect_the_bound_...)
    for key, count in counts.items():  # 1: written once; -1: a padding element, zeroed and never written
        assert set(count.unique().tolist()) <= {1, -1}, (key, count.unique())
    assert sum(int((count == -1).sum()) for count in counts.values()) == padded
