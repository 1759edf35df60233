"""The step simulator (distflow/plan/simulate): its pieces against hand calculations, its monotonicity, the
shipped profiles' sources, and the CLI. No processes, no GPU."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from distflow.config import resolve
from distflow.plan.__main__ import main
from distflow.plan.model_size import ModelArch
from distflow.plan.reshard_estimate import ReshardEstimate
from distflow.plan.simulate.best_time import interleaved_median_seconds, median_of_launches, median_seconds
from distflow.plan.simulate.compute import forward_flops_per_token, pass_time, pipeline_bubble
from distflow.plan.simulate.data_movement import Driver, Link, pipelined_sends
from distflow.plan.simulate.generation import (
    Admission,
    EngineCost,
    calls_idle,
    chunks_in_flight,
    continuous_batching,
    decode_seconds,
    generation_time,
    iterations_held,
    quantile_lengths,
)
from distflow.plan.simulate.hardware_profile import HARDWARE_DIR, Knobs, load_profile, parse_knobs
from distflow.plan.simulate.step import (
    allgather_seconds,
    cpu_contention,
    engine_contention,
    exchange_seconds,
    host_links,
    reward_pool_seconds_per_sample,
    simulate_step,
)
from distflow.plan.simulate.weight_sync import weight_sync_seconds

REPO = Path(__file__).resolve().parents[2]
SEVEN_B = str(REPO / "examples/model_configs/qwen2.5-7b.json")
OVERRIDES = (
    "model.path=x actor.tp=2 rollout.engine_tp=2 rollout.n=8 rollout.max_new_tokens=2048 "
    "data.max_prompt_length=512 actor.max_tokens_per_micro_batch=16384 dag.pipeline=grpo "
    "actor.recompute_granularity=full actor.recompute_method=uniform actor.recompute_num_layers=1 "
    "algorithm.kl_coef=0.001"
).split()


def seven_b(gpus: int):
    return resolve(
        str(REPO / "examples/configs/gpu_base.yaml"),
        OVERRIDES + [f"data.train_batch_size={16 * gpus}", f"actor.mini_batch_size={8 * gpus}"],
    )


# --- pieces against hand calculations --------------------------------------------------------------------


def test_a_transfer_is_bytes_over_bandwidth_plus_a_latency_per_message():
    assert Link(bandwidth=1e9, latency=1e-5).seconds(2e9, messages=10) == pytest.approx(2.0 + 1e-4)
    assert Link(bandwidth=1e9, latency=1e-5).seconds(0, messages=0) == 0.0
    driver = Driver(pack_bandwidth=1e9, nic_bandwidth=4e9, per_object_s=1e-6, rpc_s=1e-3)
    # 1 GB serialized (1 s) and through the NIC (0.25 s), 1000 objects, 8 calls
    assert driver.move_seconds(1e9, 1000, 8) == pytest.approx(1.0 + 0.25 + 1e-3 + 8e-3)


def test_a_weight_sync_agrees_on_every_bucket_and_at_the_end():
    arch = ModelArch.from_json(SEVEN_B)
    reshard = ReshardEstimate(
        model_bytes=4e9,
        num_engines=1,
        send_bytes=2e9,
        send_stage=0,
        recv_bytes=1e9,
        bucket_bytes=10**9,
        bandwidth_bytes_s=1e9,
    )
    link = Link(bandwidth=1e9, latency=1e-3)
    base = weight_sync_seconds(reshard, arch, link, 4e9, {})
    # 2 GB over 1 GB/s + a latency per bucket (2) + 1 GB loaded at 4 GB/s
    assert base == pytest.approx(2.0 + 2e-3 + 0.25)
    # 2 buckets + the end: 3 exchanges
    assert weight_sync_seconds(reshard, arch, link, 4e9, {}, exchange_s=0.02) == pytest.approx(base + 0.06)
    # the engine takes in 1 GB from all senders at once at 4 GB/s: the busiest sender's 2 s still bound it;
    # a slower way in (0.25 GB/s: 4 s) bounds it instead
    assert weight_sync_seconds(reshard, arch, link, 4e9, {}, engine_link=Link(4e9, 1e-3)) == base
    slow_in = weight_sync_seconds(reshard, arch, link, 4e9, {}, engine_link=Link(2.5e8, 1e-3))
    assert slow_in == pytest.approx(base + 2.0)
    # a calibrated copy out of the staging buffer (2 GB/s) replaces the load bandwidth: 0.5 s, not 0.25
    staged = weight_sync_seconds(reshard, arch, link, 4e9, {"staging_copy_bandwidth": 2e9})
    assert staged == pytest.approx(base + 0.25)


def test_a_resharder_exchange_is_the_measured_all_gather_object_or_two_all_gathers():
    intra = Link(1e9, 1e-5)
    plain = _cpu_profile(2, 0.0)
    # not measured: an all-gather of sizes and one of bytes, each a ring of 7 latencies
    assert exchange_seconds(8, intra, intra, 8, plain) == pytest.approx(2 * 7 * 1e-5)
    measured = _cpu_profile(
        2, 0.0, {"8": {"allgather_s": 0.012, "allgather_object_s": 0.02, "both_ways": 3e8}}
    )
    assert exchange_seconds(8, intra, intra, 8, measured) == 0.02
    # timed inside a chain too (from the last rank's arrival, as the resharder's ranks arrive): that one
    chained = _cpu_profile(
        2,
        0.0,
        {
            "8": {
                "allgather_s": 0.012,
                "allgather_object_s": 0.02,
                "allgather_object_chained_s": 0.015,
                "both_ways": 3e8,
            }
        },
    )
    assert exchange_seconds(8, intra, intra, 8, chained) == 0.015
    # a calibration from before the measurement: two of its all-gathers
    older = _cpu_profile(2, 0.0, {"8": {"allgather_s": 0.012, "both_ways": 3e8}})
    assert exchange_seconds(8, intra, intra, 8, older) == pytest.approx(0.024)


def test_a_driver_sends_one_share_while_it_makes_the_next():
    # one share: made, then sent
    assert pipelined_sends([(0.03, 0.02)]) == pytest.approx(0.05)
    # sends shorter than making: each hides behind the next share; only the last one's is left
    assert pipelined_sends([(0.03, 0.01), (0.03, 0.01), (0.03, 0.01)]) == pytest.approx(0.09 + 0.01)
    # sends longer: they queue behind each other from the first share made
    assert pipelined_sends([(0.01, 0.05), (0.01, 0.05)]) == pytest.approx(0.01 + 0.05 + 0.05)
    # never less than making everything or than the first share and every send; never more than the sum
    shares = [(0.012, 0.007), (0.006, 0.014), (0.003, 0.02), (0.009, 0.001)]
    t = pipelined_sends(shares)
    assert t >= sum(m for m, _ in shares) + shares[-1][1] - 1e-12
    assert t >= shares[0][0] + sum(s for _, s in shares) - 1e-12
    assert t <= sum(m + s for m, s in shares) + 1e-12
    # monotone: a slower send or a slower share never finishes sooner
    for i in range(len(shares)):
        for j in (0, 1):
            slower = [list(x) for x in shares]
            slower[i][j] *= 2
            assert pipelined_sends([tuple(x) for x in slower]) >= t - 1e-12


def test_a_training_pass_is_its_flops_over_the_achieved_rate():
    arch = ModelArch.from_json(SEVEN_B)
    per_token = 2 * arch.active_params + 2 * 2 * arch.num_layers * arch.num_heads * arch.head_dim * 1000 / 2
    assert forward_flops_per_token(arch, 1000) == pytest.approx(per_token)
    # forward + backward = 3 forwards; recompute adds a fourth; 4 GPUs at 40% of 1 PFLOP/s
    t = pass_time(arch, 1e6, 1000, 4, 1e15, 0.4, backward=True, recompute=True)
    assert t.compute_s == pytest.approx(1e6 * 4 * per_token / (4 * 1e15 * 0.4))
    assert t.bubble_s == t.tp_comm_s == t.dp_comm_s == 0.0
    # 1F1B bubble: (pp - 1) / (vpp * micro-batches) of the compute
    assert pipeline_bubble(4, 1, 8) == pytest.approx(3 / 8)
    assert pipeline_bubble(4, 2, 8) == pytest.approx(3 / 16)
    t = pass_time(arch, 1e6, 1000, 4, 1e15, 0.4, backward=False, recompute=False, pp=4, micro_batches=8)
    assert t.bubble_s == pytest.approx(t.compute_s * 3 / 8)


def test_a_decode_is_iterations_times_the_roofline():
    cost = EngineCost(
        weights_read_s=0.01,
        kv_read_s_per_token=0.0,
        flops_s_per_seq=0.0,
        iteration_overhead_s=0.0,
        prefill_s_per_token=0.0,
    )
    lengths = np.array([10, 10])
    # two slots: both run together, 10 iterations; one slot: one after the other, 20
    assert decode_seconds(lengths, 2, 0, cost) == (pytest.approx(0.1), 10)
    assert decode_seconds(lengths, 1, 0, cost) == (pytest.approx(0.2), 20)
    # the FLOP roof: 4 sequences at 5 ms of FLOPs each beat a 10 ms weight read
    busy = replace(cost, flops_s_per_seq=0.005)
    assert busy.iteration_s(4, 0) == pytest.approx(0.02)
    assert busy.iteration_s(1, 0) == pytest.approx(0.01)


def test_the_straggler_decides_the_decode():
    starts, ends = continuous_batching(np.array([100, 1, 1, 1]), slots=2)
    assert ends.max() == 100  # the long answer keeps one slot busy while the short ones pass through
    assert list(starts) == [0, 0, 1, 2]


def test_a_chunk_enters_the_engine_when_a_claimed_one_has_ended():
    lengths = np.array([3, 1, 1, 1])
    # one chunk of 2 at a time: the second waits for the first's longest answer, slots or not
    starts, ends = continuous_batching(lengths, slots=4, admission=Admission(2, 1))
    assert list(starts) == [0, 0, 3, 3] and list(ends) == [3, 1, 4, 4]
    # two in flight: both chunks from the start, as without chunks
    starts, ends = continuous_batching(lengths, slots=4, admission=Admission(2, 2))
    assert list(starts) == [0, 0, 0, 0]
    # three chunks of 1, two in flight: the third is claimed when the shorter in-flight one ends
    starts, _ = continuous_batching(np.array([3, 1, 1]), slots=4, admission=Admission(1, 2))
    assert list(starts) == [0, 0, 1]


def test_an_engine_claims_chunks_until_their_estimate_fills_the_budget():
    # 262144 tokens of budget, chunks of 8 prompts x (300 + 8 x 3072) = 199008 tokens: the first claim
    # leaves 63136 under the budget, so a second is claimed; one at a time where samples depend on the batch
    assert chunks_in_flight(262144, 8 * (300 + 8 * 3072), one_at_a_time=False) == 2
    assert chunks_in_flight(262144, 8 * (300 + 8 * 3072), one_at_a_time=True) == 1
    assert chunks_in_flight(1000, 100, one_at_a_time=False) == 10
    assert chunks_in_flight(1000, 5000, one_at_a_time=False) == 1


def test_quantile_lengths_follow_the_knobs():
    lengths = quantile_lengths(1001, 4096, 0.25, 0.7)
    assert np.median(lengths) == pytest.approx(1024, rel=0.01)
    assert lengths.max() <= 4096 and lengths.min() >= 1


def test_timing_is_the_median_after_a_warm_up(monkeypatch):
    from distflow.plan.simulate import best_time

    # the call takes 10 s the first time (warm-up, excluded), then 0.3, 0.1, 0.2 and a preempted 5 s
    durations = iter([10.0, 0.3, 0.1, 0.2, 5.0])
    now = [0.0]

    def call():
        now[0] += next(durations)

    monkeypatch.setattr(best_time.time, "perf_counter", lambda: now[0])
    assert median_seconds(call, repeats=4) == pytest.approx((0.2 + 0.3) / 2)


def test_calls_whose_difference_is_calibrated_are_timed_in_turn(monkeypatch):
    from distflow.plan.simulate import best_time

    # "short" takes 1 s and "long" 3 s, but the machine is twice as slow during the second round: timed in
    # turn, the slow spell lands on both calls' second runs, and the medians of 3 keep the 2 s difference
    order, now = [], [0.0]
    base = {"short": 1.0, "long": 3.0}

    def timed(key):
        def call():
            order.append(key)
            second_round = len(order) in (5, 6)  # after the 2 warm-ups and the first round's 2 calls
            now[0] += base[key] * (2.0 if second_round else 1.0)

        return call

    monkeypatch.setattr(best_time.time, "perf_counter", lambda: now[0])
    medians = interleaved_median_seconds({"short": timed("short"), "long": timed("long")}, repeats=3)
    assert order == ["short", "long"] + ["short", "long"] * 3  # one warm-up each, then round by round
    assert medians == {"short": pytest.approx(1.0), "long": pytest.approx(3.0)}


def test_a_launch_that_ran_slow_throughout_does_not_set_the_calibrated_figure():
    # the second launch's processes were slow in every round (0.84 ms -> 3.11 ms, as one calibration saw):
    # each number is the median of the launches', nested dicts (gloo_by_ranks) included
    launches = iter(
        [
            {"latency": 50e-6, "by_ranks": {"2": {"allgather_object_chained_s": 0.84e-3}}},
            {"latency": 40e-6, "by_ranks": {"2": {"allgather_object_chained_s": 3.11e-3}}},
            {"latency": 60e-6, "by_ranks": {"2": {"allgather_object_chained_s": 0.90e-3}}},
        ]
    )
    combined = median_of_launches(lambda: next(launches), launches=3)
    assert combined == {
        "latency": pytest.approx(50e-6),
        "by_ranks": {"2": {"allgather_object_chained_s": 0.90e-3}},
    }


def _cpu_profile(cores=2, idle=1.0, crowd=None):
    measured = {"engine": {"idle_cpu_cores": idle}} if idle else {}
    if crowd:
        measured["gloo_by_ranks"] = crowd
    profile = load_profile("h100")
    return replace(profile.with_entry("cores", cores, "test"), measured=measured)


def test_idle_engines_share_the_cores_with_the_trainer():
    # 2 trainers + 2 engines each polling a whole core, on 2 cores: 4 busy processes, each gets half a
    # core; the probe ran the 2 trainers alone on the 2 cores (a core each): twice as slow in the job
    assert cpu_contention(_cpu_profile(2, 1.0), 2, 2, 2) == pytest.approx(2.0)
    # half a core per idle engine: 3 busy on 2 cores
    assert cpu_contention(_cpu_profile(2, 0.5), 2, 2, 2) == pytest.approx(1.5)
    # a probe of one process (the FLOP model's one-thread rate) against 2 trainers + 2 engines on 2 cores
    assert cpu_contention(_cpu_profile(2, 1.0), 2, 2, 1) == pytest.approx(2.0)
    # enough cores: no slowdown; no measurement (a GPU profile): none either
    assert cpu_contention(_cpu_profile(8, 1.0), 2, 2, 2) == 1.0
    assert cpu_contention(_cpu_profile(2, 0.0), 8, 8, 2) == 1.0
    # monotone: more idle CPU or more ranks never makes it faster
    values = [cpu_contention(_cpu_profile(2, idle), n, n, 2) for n in (2, 4) for idle in (0.25, 0.5, 1.0)]
    assert values == sorted(values)


def test_engines_that_generate_share_the_cores():
    def profile(cores, busy):
        base = _cpu_profile(cores, 0.0)
        return replace(base, measured={"engine": {"generating_cpu_cores": busy}} if busy else {})

    # one engine alone keeps 1.5 cores of 2 busy (the calibration); 2 of them want 3 cores: 1.5x slower
    assert engine_contention(profile(2, 1.5), 2) == pytest.approx(1.5)
    # the calibrated engine alone already wanted more than the cores: only the extra counts
    assert engine_contention(profile(2, 4.0), 2) == pytest.approx(8 / 2 / (4 / 2))
    # enough cores, one engine, or no measurement (a GPU profile): none
    assert engine_contention(profile(8, 1.5), 2) == 1.0
    assert engine_contention(profile(2, 1.5), 1) == 1.0
    assert engine_contention(profile(2, 0.0), 8) == 1.0
    # monotone in the engines and in the CPU each keeps busy
    values = [engine_contention(profile(2, busy), n) for n in (1, 2, 4) for busy in (0.5, 1.0, 2.0)]
    assert all(v >= 1.0 for v in values)
    assert [engine_contention(profile(2, 1.0), n) for n in (1, 2, 4, 8)] == sorted(
        engine_contention(profile(2, 1.0), n) for n in (1, 2, 4, 8)
    )
    # engines timed generating at once: their measured slowdown, at that count only
    crowded = replace(
        profile(2, 1.0),
        measured={"engine": {"generating_cpu_cores": 1.0, "slowdown_by_engines": {"2": 1.14}}},
    )
    assert engine_contention(crowded, 2) == pytest.approx(1.14)
    assert engine_contention(crowded, 4) == pytest.approx(2.0)  # not measured: the cores rule


def test_a_cpu_job_never_releases_its_engines(arch, h100):
    # the rollout worker releases and resumes an engine's memory around training only on GPUs
    engine = {"decode_iteration_s_base": 1e-3, "decode_iteration_s_per_seq": 1e-5, "release_resume_s": 0.3}
    calibrated = replace(h100, measured={"engine": engine})

    def generate(device):
        cfg = resolve(
            str(REPO / "examples/configs/gpu_base.yaml"),
            OVERRIDES
            + ["data.train_batch_size=128", "actor.mini_batch_size=64", f"trainer.device={device}"]
            # the engines take chunks one at a time either way (as on CPU), so only the release differs
            + ["rollout.sglang.enable_custom_logit_processor=true"],
        )
        return simulate_step(cfg, arch, 8, calibrated, "multi", time_planning=False).phases["generate"]

    assert generate("auto") == pytest.approx(generate("cpu") + 0.3)


def test_a_crowd_measurement_replaces_the_oversubscription_rule():
    plain = _cpu_profile(2, 0.0)
    intra, _ = host_links(plain, 8)
    # the rule: bandwidth x cores / ranks, latency x ranks / cores
    assert intra.bandwidth == pytest.approx(plain.intra_bandwidth.value / 4)
    assert intra.latency == pytest.approx(plain.intra_latency.value * 4)
    # a ring all-gather of 8 ranks on one host: 7 latencies
    assert allgather_seconds(8, intra, intra, 8, plain) == pytest.approx(7 * intra.latency)
    measured = _cpu_profile(2, 0.0, {"8": {"allgather_s": 0.012, "both_ways": 3e8}})
    intra, _ = host_links(measured, 8)
    assert intra.bandwidth == 3e8
    assert allgather_seconds(8, intra, intra, 8, measured) == 0.012
    # not measured at 4 ranks, or spanning nodes: the rule
    intra4, _ = host_links(measured, 4)
    assert intra4.bandwidth == pytest.approx(measured.intra_bandwidth.value / 2)
    assert allgather_seconds(16, intra, intra, 8, measured) == pytest.approx(
        7 * intra.latency + intra.latency
    )


def test_a_rank_scores_at_the_pools_measured_rate_with_its_worker_count():
    plain = replace(_cpu_profile(2, 0.0), knobs=Knobs(reward_workers_per_rank=2.0))
    # not measured: the scorer's own time over the knob's workers
    per_sample = plain.reward_seconds_per_sample.value
    assert reward_pool_seconds_per_sample(plain, 1) == pytest.approx(per_sample / 2)
    # measured through a pool of 1 worker: that rate, for that worker count only
    measured = replace(
        plain, measured={"reward": {"reward_pool_s_per_sample": 1.5e-4, "reward_pool_workers": 1}}
    )
    assert reward_pool_seconds_per_sample(measured, 1) == 1.5e-4
    assert reward_pool_seconds_per_sample(measured, 4) == pytest.approx(per_sample / 2)


def test_the_reward_phase_is_an_engines_samples_at_the_pool_rate(arch, h100):
    # 128 prompts x 8 samples over 8 GPUs with engine TP 2: 4 engines, 32 prompts (256 samples) each
    cfg = resolve(
        str(REPO / "examples/configs/gpu_base.yaml"),
        OVERRIDES + ["data.train_batch_size=128", "actor.mini_batch_size=64", "reward.num_workers=2"],
    )
    pooled = replace(h100, measured={"reward": {"reward_pool_s_per_sample": 1e-4, "reward_pool_workers": 2}})
    multi = simulate_step(cfg, arch, 8, pooled, "multi", time_planning=False)
    assert multi.phases["reward"] == pytest.approx(256 * 1e-4)
    # the single controller scores all 1024 in its driver at the scorer's own rate
    single = simulate_step(cfg, arch, 8, pooled, "single", time_planning=False)
    assert single.phases["reward"] == pytest.approx(1024 * h100.reward_seconds_per_sample.value)


# --- monotonicity ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def arch():
    return ModelArch.from_json(SEVEN_B)


@pytest.fixture(scope="module")
def h100():
    return load_profile("h100")


def test_more_bandwidth_is_never_slower(arch, h100):
    for gpus in (8, 16):
        base = simulate_step(seven_b(gpus), arch, gpus, h100, "multi", time_planning=False)
        for name in ("intra_bandwidth", "inter_bandwidth", "hbm_bandwidth"):
            faster = h100.with_entry(name, 2 * getattr(h100, name).value, "test")
            for c in ("multi", "single"):
                before = base if c == "multi" else simulate_step(seven_b(gpus), arch, gpus, h100, c, False)
                after = simulate_step(seven_b(gpus), arch, gpus, faster, c, time_planning=False)
                assert after.seconds <= before.seconds + 1e-9, (gpus, name, c)
    driver = h100.with_entry("serialize_bandwidth", 10 * h100.serialize_bandwidth.value, "test")
    assert (
        simulate_step(seven_b(16), arch, 16, driver, "single").seconds
        < simulate_step(seven_b(16), arch, 16, h100, "single").seconds
    )


def test_the_single_controller_is_never_faster_and_falls_behind_with_gpus(arch, h100):
    ratios = []
    for gpus in (8, 16, 32):
        multi = simulate_step(seven_b(gpus), arch, gpus, h100, "multi", time_planning=False)
        single = simulate_step(seven_b(gpus), arch, gpus, h100, "single")
        assert single.seconds >= multi.seconds
        assert single.phases["generate"] == multi.phases["generate"]  # the same engines
        ratios.append(single.seconds / multi.seconds)
    assert ratios == sorted(ratios)


# --- profiles and CLI ------------------------------------------------------------------------------------


def test_every_shipped_number_has_a_source():
    for path in HARDWARE_DIR.glob("*.json"):
        data = json.loads(path.read_text())
        for section, entries in data.items():
            if section == "name":
                continue
            entries = {section: entries} if "value" in entries else entries
            for key, entry in entries.items():
                assert entry["source"].strip(), f"{path.name}: {section}.{key} has no source"
    for name in ("h100", "h200", "a100"):
        profile = load_profile(name)
        assert all(source for _, _, source in profile.sources()), name


def test_knobs_parse_and_unknown_ones_fail():
    assert parse_knobs(["train_mfu=0.3", "weak_scaling=false"]) == Knobs(train_mfu=0.3, weak_scaling=False)
    with pytest.raises(ValueError, match="unknown knob"):
        parse_knobs(["mfu=0.3"])


def test_cli_prints_the_table_and_writes_the_plot(tmp_path, capsys):
    png = tmp_path / "scaling.png"
    args = [str(REPO / "examples/configs/gpu_base.yaml"), *OVERRIDES, "data.train_batch_size=128"]
    args += [
        "--model-config",
        SEVEN_B,
        "--world-size",
        "8",
        "--simulate",
        "--gpus",
        "8,16",
        "--plot",
        str(png),
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert (
        "multi/single" in out and "tokens/s" in out and "source" not in out.split("simulated step")[0][-10:]
    )
    assert png.stat().st_size > 10_000


def test_an_engine_fed_one_chunk_at_a_time_waits_through_each_chunks_round_trip():
    cost = EngineCost(0.0, 0.0, 0.0, 0.01, 0.0, call_overhead_s=0.004)
    one_by_one, two_in_flight = Admission(64, 1), Admission(64, 2)
    # 128 samples in chunks of 64: two round trips when the second is sent after the first's results,
    # one (the first's) when the second is already in flight, and one for the whole batch in one call
    assert calls_idle(one_by_one, 128) == 2 and calls_idle(one_by_one, 129) == 3
    assert calls_idle(two_in_flight, 128) == 1 and calls_idle(Admission(), 128) == 1
    assert calls_idle(one_by_one, 0) == 0
    serial = generation_time(1, 128, 512, 0.0, 8, cost, 1.0, 0.0, admission=one_by_one)
    overlapped = generation_time(1, 128, 512, 0.0, 8, cost, 1.0, 0.0, admission=two_in_flight)
    # every answer 8 tokens: the serial engine runs 8 + 8 iterations and two round trips
    assert serial.calls_s == pytest.approx(0.008) and serial.decode_s == pytest.approx(16 * 0.01)
    assert serial.seconds == pytest.approx(0.16 + 0.008)
    assert overlapped.calls_s == pytest.approx(0.004) and overlapped.decode_s == pytest.approx(8 * 0.01)


def test_an_answer_ended_by_a_stop_token_holds_its_slot_one_iteration_more():
    # 5 tokens with EOS: 6 iterations; cut at max_new_tokens 8: 8; 1 token: 2
    assert list(iterations_held(np.array([5, 8, 1]), 8)) == [6, 8, 2]
    cost = EngineCost(0.0, 0.0, 0.0, 0.01, 0.0)
    # 64 answers of 5 tokens (median 5 / 8, no spread) in one call: 6 iterations of 10 ms
    gen = generation_time(1, 64, 512, 0.0, 8, cost, 5 / 8, 0.0)
    assert gen.iterations == 6 and gen.decode_s == pytest.approx(0.06) and gen.response_tokens == 64 * 5
