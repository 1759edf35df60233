"""perf/mfu/actor's arithmetic against a hand count, GPU peaks by name, memory metrics on CPU."""

from types import SimpleNamespace

import pytest

from distflow.tracking.perf import ActorMFU, memory_metrics, peak_flops


def test_peak_by_device_name():
    assert peak_flops("NVIDIA H200") == 989e12 and peak_flops("NVIDIA H20") == 148e12
    assert peak_flops("NVIDIA A100-SXM4-80GB") == 312e12 and peak_flops("NVIDIA L40S") == 362e12
    assert peak_flops("cpu") is None


def test_actor_mfu_hand_count():
    arch = SimpleNamespace(
        active_params=1000, embedding_params=100, tie_embeddings=False, num_layers=2, num_heads=2, head_dim=4
    )
    m = ActorMFU(arch, peak=1e6, gpus=2, epochs=2)
    # 10 samples of 20 tokens: per token 6 x 900 + 12 x 2 layers x 8 width x 20 = 9240 FLOPs.
    got = m.metrics({"rollout/tokens": 200, "rollout/samples": 10, "timing_s/train_actor": 4.0})
    assert got["perf/mfu/actor"] == pytest.approx(9240 * 200 * 2 / (4.0 * 1e6 * 2))
    assert m.metrics({"rollout/tokens": 200}) == {}  # no update timed: no MFU


def test_memory_on_cpu():
    got = memory_metrics(cuda=False)
    assert set(got) == {"perf/cpu_memory_used_gb"} and 0.01 < got["perf/cpu_memory_used_gb"] < 1024
