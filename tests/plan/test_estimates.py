"""The planner's pure estimates against published numbers and hand-computed values."""

import json
import math
from pathlib import Path

import pytest

from distflow.layout import ParallelLayout
from distflow.plan import memory
from distflow.plan.model_size import ModelArch, engine_params_per_gpu, megatron_shard_params
from distflow.plan.reshard_estimate import estimate_reshard

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "model_configs"


def arch(name: str) -> ModelArch:
    return ModelArch.from_json(CONFIGS / f"{name}.json")


@pytest.mark.parametrize(
    "name, published_b",
    [
        ("qwen2.5-7b", 7.62),
        ("qwen2.5-32b", 32.8),
        ("qwen2.5-72b", 72.7),
        ("llama3.1-70b", 70.6),
        ("qwen3-30b-a3b", 30.5),
        ("qwen3-235b-a22b", 235.1),
    ],
)
def test_parameter_counts_match_the_published_sizes(name, published_b):
    assert arch(name).total_params / 1e9 == pytest.approx(published_b, rel=0.01)


def test_moe_active_parameters():
    assert arch("qwen3-30b-a3b").active_params / 1e9 == pytest.approx(3.3, rel=0.03)
    assert arch("qwen3-235b-a22b").active_params / 1e9 == pytest.approx(22.0, rel=0.03)


def test_shipped_configs_are_architecture_only():
    for path in CONFIGS.glob("*.json"):
        cfg = json.loads(path.read_text())
        assert cfg["architectures"] and "num_hidden_layers" in cfg, path
        assert not any(k.endswith("_path") or k == "auto_map" for k in cfg), path


def test_shards_add_up_to_the_model():
    """Summed over TP x PP (dense) and EP x ETP (experts), one replica's shards are the whole model."""
    a = arch("qwen3-30b-a3b")
    tp, pp, ep, etp = 2, 2, 8, 1
    total = 0.0
    for stage in range(pp):
        shard = megatron_shard_params(a, tp, pp, ep, etp, stage, vocab_padding=False)
        replicated = a.num_layers / pp * a.replicated_params + (a.hidden_size if stage == pp - 1 else 0)
        total += (shard.dense - replicated) * tp + replicated + shard.expert * ep * etp
    assert total == pytest.approx(a.total_params, rel=1e-9)


def test_vocab_padding_and_tied_output():
    a = arch("qwen2.5-7b")
    # 152064 is already a multiple of 128 * 2; at TP 8 Megatron pads to a multiple of 1024.
    s8 = megatron_shard_params(a, 8, 1, 1, 1, 0)
    s8_unpadded = megatron_shard_params(a, 8, 1, 1, 1, 0, vocab_padding=False)
    assert s8.dense - s8_unpadded.dense == pytest.approx(2 * (152576 - 152064) * 3584 / 8)
    critic = megatron_shard_params(a, 1, 2, 1, 1, 1, value_head=True)
    actor = megatron_shard_params(a, 1, 2, 1, 1, 1)
    assert actor.dense - critic.dense == pytest.approx(152064 * 3584 - 3584)


def test_activation_formula_reduces_to_korthikanti_et_al():
    """Multi-head attention (g = a, d = h / a) with a GeLU-sized MLP (3f = 8h): the paper's per-layer
    sbh(34 + 5as/h) without its 2sbh of dropout masks and, with flash attention, without the s^2 term."""
    h, a = 96, 8
    mha = ModelArch(
        num_layers=2,
        hidden_size=h,
        num_heads=a,
        num_kv_heads=a,
        head_dim=h // a,
        ffn_hidden_size=8 * h // 3,
        vocab_size=1000,
    )

    def bytes_per_token(**kw):
        return 2 * memory.layer_activation_elements(mha, **kw)

    assert bytes_per_token(tp=1, sequence_parallel=False) == 32 * h
    # TP without SP: 10 + 24/t in the paper, 2 of the 10 being dropout masks.
    assert bytes_per_token(tp=4, sequence_parallel=False) == pytest.approx((8 + 24 / 4) * h)
    assert bytes_per_token(tp=4, sequence_parallel=True) == pytest.approx(32 * h / 4)
    # Unfused attention keeps the softmax: 2as bytes per token (the paper's 5as less the dropout's 3as).
    s = 512
    assert bytes_per_token(tp=1, sequence_parallel=False, seq_len=s) == pytest.approx(32 * h + 2 * a * s)


def test_recompute_and_pipeline_in_flight():
    a = arch("qwen2.5-7b")
    common = dict(
        tokens=4096,
        tp=1,
        pp=4,
        vpp=1,
        cp=1,
        etp=1,
        sequence_parallel=False,
        recompute_method=None,
        recompute_num_layers=None,
        micro_batches=16,
        padded_vocab=152064,
    )
    none = memory.activation_bytes(a, recompute=None, stage=0, **common)
    full = memory.activation_bytes(a, recompute="full", stage=0, **common)
    layers = 28 // 4
    assert none.in_flight == 4 and none.logits == 0  # 1F1B: the first stage holds pp micro-batches
    assert none.total == pytest.approx(4 * layers * none.per_layer)
    assert full.total == pytest.approx(4 * layers * 2 * 4096 * 3584 + none.per_layer)
    last = memory.activation_bytes(a, recompute=None, stage=3, **common)
    assert last.in_flight == 1 and last.logits == pytest.approx(6 * 4096 * 152064)
    few = memory.activation_bytes(a, recompute=None, stage=0, **{**common, "micro_batches": 2})
    assert few.in_flight == 2
    inter = memory.activation_bytes(a, recompute=None, stage=0, **{**common, "vpp": 7})
    assert inter.in_flight == pytest.approx(4 * (1 + 3 / 28))


def test_model_states_with_and_without_the_distributed_optimizer():
    params = memory.ShardParams(dense=1e9, expert=2e9)
    dist = memory.model_state_bytes(params, "bfloat16", True, True, dense_dp=4, expert_dp=2)
    assert (dist.weights, dist.grads) == (6e9, 12e9)
    assert dist.optimizer == pytest.approx(12 * 1e9 / 4 + 12 * 2e9 / 2)
    assert dist.optimizer_unsharded == 36e9
    plain = memory.model_state_bytes(params, "bfloat16", True, False, dense_dp=4, expert_dp=2)
    assert plain.optimizer == 36e9
    ref = memory.model_state_bytes(params, "bfloat16", False, False, dense_dp=4, expert_dp=2)
    assert ref.total == 6e9
    fp32 = memory.model_state_bytes(params, "float32", True, False, dense_dp=1, expert_dp=1)
    assert fp32.total == 3e9 * (4 + 4 + 8)


def test_engine_kv_budget():
    a = arch("qwen2.5-72b")
    # 80 layers x (8 KV heads / TP 8 = 1 head) x 128 x (K and V) x 2 bytes
    assert memory.kv_bytes_per_token(a, 8) == 80 * 1 * 128 * 2 * 2
    # KV heads replicate past 8: TP 16 still holds one head per GPU
    assert memory.kv_bytes_per_token(a, 16) == memory.kv_bytes_per_token(a, 8)
    gib = memory.GiB
    e = memory.engine_memory(80 * gib, 0.8, 18 * gib, resident_bytes=30 * gib, kv_per_token=40960)
    assert e.kv_cache == pytest.approx(0.8 * 50 * gib - 18 * gib)
    assert e.kv_tokens == int(e.kv_cache // 40960)
    full = memory.engine_memory(80 * gib, 0.2, 18 * gib, resident_bytes=0, kv_per_token=40960)
    assert full.kv_cache < 0 and full.kv_tokens == 0


def test_engine_weights_replicate_kv_heads():
    a = arch("qwen3-235b-a22b")  # 4 KV heads
    kv = a.num_layers * a.kv_params
    assert engine_params_per_gpu(a, 4) == pytest.approx(a.total_params / 4)
    assert engine_params_per_gpu(a, 16) == pytest.approx((a.total_params - kv) / 16 + kv / 4)


def test_reshard_bytes_buckets_and_lower_bound():
    a = arch("qwen2.5-7b")
    actor = ParallelLayout.for_world(8, tp=2)  # dp 4
    est = estimate_reshard(a, actor, num_engines=8, engine_tp=1, bucket_mb=512, bandwidth_gbps=400)
    shard = 2 * megatron_shard_params(a, 2, 1, 1, 1, 0, vocab_padding=False).total
    assert est.send_bytes == pytest.approx(shard * 2)  # 8 engines over 4 replicas of each shard
    assert est.recv_bytes == pytest.approx(2 * a.total_params)
    assert est.model_buckets == math.ceil(2 * a.total_params / 2**29)
    assert est.sender_buckets == math.ceil(est.send_bytes / 2**29)
    assert est.seconds_lower_bound == pytest.approx(max(est.send_bytes, est.recv_bytes) / 50e9)
    assert est.total_bytes == pytest.approx(8 * 2 * a.total_params)
    assert est.staging_bytes == 2 * 2**29  # two buckets in flight
    tiny = estimate_reshard(a, actor, num_engines=8, engine_tp=1, bucket_mb=10**6, bandwidth_gbps=400)
    assert tiny.staging_bytes == pytest.approx(2 * est.recv_bytes)  # a bucket never exceeds the rank's slice
