"""One RL step's time at a GPU count, phase by phase, for a multi- or single-controller framework.

Built on the dry-run plan (report.build_plan: layouts, engine KV pool, weight-sync bytes) and the real
data plan (data_movement.plan_edge). Phases add up (a lock-step step runs its DAG nodes in order):
  generate   the slowest engine's prefill + decode (generation.py)
  reward     scoring every sample: on the engine owners, in parallel, through each rank's reward pool
             (multi); in the driver (single)
  logprob    forward passes of the actor / reference / critic nodes (compute.py)
  train      the update passes, with pipeline bubbles, TP and DP communication (compute.py)
  data       moving each DAG edge between layouts (data_movement.py)
  sync       the weight sync: the reshard plan's busiest bytes over the link, plus the engine's load
  control    one barrier per DAG node (multi); one call per worker per DAG node from the driver (single)
Both controllers run the same engines and Megatron passes; they differ in reward, data and control.
"""

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from distflow.coordination.data.layouts import PlacedLayout
from distflow.dag.data_mover import CoordinatorMover
from distflow.dag.loading import load_pipeline
from distflow.plan.memory import kv_bytes_per_token
from distflow.plan.model_size import ModelArch, engine_params_per_gpu, megatron_shard_params
from distflow.plan.report import build_plan
from distflow.plan.simulate.compute import pass_time
from distflow.plan.simulate.data_movement import (
    Driver,
    Link,
    multi_controller_seconds,
    output_bytes,
    plan_edge,
)
from distflow.plan.simulate.generation import (
    Admission,
    EngineCost,
    chunks_in_flight,
    generation_time,
    quantile_lengths,
)
from distflow.plan.simulate.hardware_profile import Profile
from distflow.plan.simulate.padded_tokens import padded_pass
from distflow.plan.simulate.weight_sync import weight_sync_seconds

PHASES = ("generate", "reward", "logprob", "train", "data", "sync", "control")
CONTROLLERS = ("multi", "single")


@dataclass
class StepPrediction:
    gpus: int
    controller: str
    phases: dict[str, float] = field(default_factory=dict)
    tokens: float = 0.0
    """Prompt + response tokens of the step's samples (the paper's throughput counts both)."""
    samples: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(self.phases.values())

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def host_links(profile: Profile, ranks_on_host: int) -> tuple[Link, Link]:
    """Intra- and inter-node links; where more ranks share a host than it has cores (a CPU machine),
    concurrent transfers share the cores: the bandwidth each rank gets is the one measured with that many
    processes exchanging at once where --calibrate measured it (measured["gloo_by_ranks"]), else the
    2-process figure x cores / ranks; a message's latency grows by ranks / cores."""
    share = min(1.0, profile.cores.value / max(1, ranks_on_host))
    crowd = crowd_measurement(profile, ranks_on_host)
    intra_bw = crowd["both_ways"] if crowd else profile.intra_bandwidth.value * share
    return (
        Link(intra_bw, profile.intra_latency.value / share),
        Link(profile.inter_bandwidth.value * share, profile.inter_latency.value / share),
    )


def crowd_measurement(profile: Profile, ranks_on_host: int) -> Optional[dict]:
    """What --calibrate measured with `ranks_on_host` gloo processes on this host at once, or None."""
    return profile.measured.get("gloo_by_ranks", {}).get(str(ranks_on_host))


def copies_at_once(profile: Profile) -> float:
    """How many processes copy memory at full speed at once on this host: what --calibrate measured with a
    process per core copying (measured["copies_at_once"]: below the cores where they share the memory
    bandwidth), else the cores."""
    return profile.measured.get("copies_at_once", profile.cores.value)


def engine_cost(arch: ModelArch, engine_tp: int, profile: Profile, spans_nodes: bool) -> EngineCost:
    """Roofline costs of one engine GPU (GPU profiles), or the measured ones (a calibrated profile)."""
    k, m = profile.knobs, profile.measured.get("engine")
    if m:
        return EngineCost(
            weights_read_s=0.0,
            kv_read_s_per_token=0.0,
            flops_s_per_seq=m["decode_iteration_s_per_seq"],
            iteration_overhead_s=m["decode_iteration_s_base"],
            prefill_s_per_token=m.get("prefill_s_per_token", 0.0),
            request_overhead_s=m.get("request_s", 0.0),
            call_overhead_s=m.get("call_s", 0.0),
        )
    # a call's round trip (call_overhead_s) is left out here: milliseconds against generations of seconds
    hbm = profile.hbm_bandwidth.value * k.decode_bandwidth_efficiency
    tp_latency = (profile.inter_latency if spans_nodes else profile.intra_latency).value
    return EngineCost(
        weights_read_s=2 * engine_params_per_gpu(arch, engine_tp) / hbm,
        kv_read_s_per_token=kv_bytes_per_token(arch, engine_tp) / hbm,
        flops_s_per_seq=2 * arch.active_params / engine_tp / (profile.flops.value * k.prefill_mfu),
        iteration_overhead_s=k.decode_iteration_overhead_s
        + (2 * arch.num_layers * tp_latency if engine_tp > 1 else 0.0),
        prefill_s_per_token=2 * arch.active_params / (engine_tp * profile.flops.value * k.prefill_mfu),
    )


def simulate_step(
    cfg, arch: ModelArch, gpus: int, profile: Profile, controller: str, time_planning: bool = True
) -> StepPrediction:
    """cfg: the config at this GPU count (the caller scales the batch for weak scaling). Raises the
    planner's errors (LayoutError, ...) when the layout does not fit `gpus`. time_planning: count the
    data plan's computation, timed on this machine (False: a deterministic result, for tests)."""
    assert controller in CONTROLLERS, f"controller must be one of {CONTROLLERS}, got {controller!r}"
    k = profile.knobs
    per_node = int(profile.gpus_per_node.value)
    plan = build_plan(
        cfg,
        gpus,
        arch,
        gpu_memory_gb=profile.memory.value / 2**30,
        gpus_per_node=per_node,
    )
    cluster, p = plan.cluster, plan.cluster.placement
    out = StepPrediction(
        gpus,
        controller,
        notes=[]
        if plan.fits
        else [f"the plan does not fit {plan.gpu_bytes / 2**30:.0f} GiB GPUs at {gpus} GPUs"],
    )
    intra, inter = host_links(profile, min(gpus, per_node))
    multi_node = gpus > per_node
    dp_link = inter if multi_node else intra

    # --- the samples ----------------------------------------------------------------------------------
    prompts, n = cfg.data.train_batch_size, cfg.rollout.n
    prompt_len = k.prompt_length_fraction * cfg.data.max_prompt_length
    responses = quantile_lengths(
        prompts * n, cfg.rollout.max_new_tokens, k.response_length_fraction, k.response_length_sigma
    )
    # Interleaved so that every block of prompts (one engine's) gets short and long answers alike.
    responses = responses[np.argsort(np.arange(len(responses)) % max(1, prompts), kind="stable")]
    lengths = np.round(prompt_len + responses).astype(np.int64)
    out.samples, out.tokens = len(lengths), float(lengths.sum())
    mean_len = float(lengths.mean())

    # --- generation -----------------------------------------------------------------------------------
    samples_per_engine = math.ceil(prompts / p.num_engines) * n
    slots = max(1, min(k.max_running_requests, int(plan.engine.kv_tokens // max(1.0, mean_len))))
    cost = engine_cost(arch, p.engine_tp, profile, p.engine_tp > per_node)
    gen = generation_time(
        p.num_engines,
        samples_per_engine,
        slots,
        prompt_len,
        cfg.rollout.max_new_tokens,
        cost,
        k.response_length_fraction,
        k.response_length_sigma,
        seed=k.seed,
        admission=admission_of(cfg, p.num_engines, prompt_len),
    )
    engines_on_host = max(1, min(len(p.rollout_ranks), per_node) // p.engine_tp)
    out.phases["generate"] = gen.seconds * engine_contention(profile, engines_on_host)
    if p.kind == "colocated" and cfg.rollout.release_memory_in_training and cfg.trainer.device != "cpu":
        # The engine frees its memory for training and takes it back to generate (the rollout worker's
        # release_between_steps: on CPU SGLang has nothing to release, and the worker skips it).
        out.phases["generate"] += profile.measured.get("engine", {}).get("release_resume_s", 0.0)

    # --- reward ---------------------------------------------------------------------------------------
    per_sample = profile.reward_seconds_per_sample.value
    out.phases["reward"] = (
        samples_per_engine * reward_pool_seconds_per_sample(profile, cfg.reward.num_workers)
        if controller == "multi"
        else out.samples * per_sample
    )

    # --- Megatron passes ------------------------------------------------------------------------------
    pipeline = load_pipeline(cfg)
    nodes = pipeline.validate()
    ranks_on_host = min(len(p.train_ranks), per_node)
    engine_ranks_on_host = min(len(p.rollout_ranks), per_node)
    logprob_s = train_s = 0.0
    for node in nodes:
        if node.role not in ("actor", "ref", "critic"):
            continue
        layout = getattr(cluster, node.role)
        rc = getattr(cfg, node.role)
        trains = node.id.startswith("train_")
        # the tokens computed: the busiest DP rank's rows padded as the worker cuts its micro-batches
        padded = padded_pass(lengths, n, layout.dp, rc, layout.tp, layout.pp, layout.vpp, trains)
        tokens_per_dp = padded.tokens
        mini_batches = max(1, prompts // (getattr(rc, "mini_batch_size", None) or prompts)) if trains else 1
        epochs = getattr(rc, "ppo_epochs", 1) if trains else 1
        shard = megatron_shard_params(arch, layout.tp, layout.pp, layout.ep, layout.etp, 0)
        t = pass_time(
            arch,
            tokens_per_dp * epochs,
            mean_len / 2,
            layout.tp * layout.pp * layout.cp,
            profile.flops.value,
            k.train_mfu if trains else k.forward_mfu,
            backward=trains,
            recompute=trains and getattr(rc, "recompute_granularity", None) == "full",
            pp=layout.pp,
            vpp=layout.vpp,
            micro_batches=padded.micro_batches,
            tp=layout.tp,
            tp_bandwidth=(intra if layout.tp <= per_node else inter).bandwidth,
            tp_latency=(intra if layout.tp <= per_node else inter).latency,
            grad_bytes_per_rank=2 * (shard.dense + shard.expert),
            dp=layout.dp * layout.cp,
            dp_bandwidth=dp_link.bandwidth,
            dp_latency=dp_link.latency,
            optimizer_steps=mini_batches * epochs,
        )
        measured = profile.measured.get("megatron")
        if measured and (measured["tp"], measured["pp"]) == (layout.tp, layout.pp):
            # A calibrated profile timed this model in this layout: a fixed cost per pass (per optimizer
            # step when training) and a cost per token, instead of the FLOP model.
            kind = "train" if trains else "forward"
            steps = mini_batches * epochs if trains else 1
            seconds = (
                steps * measured[f"{kind}_fixed_s"] + tokens_per_dp * epochs * measured[f"{kind}_s_per_token"]
            )
            seconds *= cpu_contention(
                profile, ranks_on_host, engine_ranks_on_host, measured["tp"] * measured["pp"]
            )
        else:
            seconds = t.seconds * cpu_contention(profile, ranks_on_host, engine_ranks_on_host, 1)
        if trains:
            train_s += seconds
        else:
            logprob_s += seconds
    out.phases["logprob"], out.phases["train"] = logprob_s, train_s

    # --- data movement --------------------------------------------------------------------------------
    mover = CoordinatorMover(pipeline, cluster, None)
    producers = pipeline.producers()
    if controller == "multi":
        seconds, moved = 0.0, set()
        for node in nodes:
            for name in node.inputs:
                src_id = producers.get(name)
                if src_id is None or name not in pipeline.fields:
                    continue
                src, dst = mover.node_layouts[src_id], mover.node_layouts[node.id]
                if (src.same_ranks_as(dst) and src.replicated == dst.replicated) or (name, dst) in moved:
                    continue
                moved.add((name, dst))
                edge, planning_s = plan_edge(
                    src, dst, lengths, n, pipeline.fields[name], keep_groups=node.keep_groups
                )
                seconds += planning_s if time_planning else 0.0
                seconds += multi_controller_seconds(
                    edge, per_node, intra, inter, allgather_seconds(gpus, inter, intra, per_node, profile)
                )
        out.phases["data"] = seconds
    else:
        driver = driver_of(profile)
        seconds = 0.0
        for node in nodes:
            for name in node.inputs:
                if name in pipeline.fields:
                    seconds += driver.move_seconds(
                        output_bytes(pipeline.fields[name], lengths), out.samples, 0
                    )
            for name in node.outputs:
                if name in pipeline.fields:
                    seconds += driver.move_seconds(
                        output_bytes(pipeline.fields[name], lengths), out.samples, 0
                    )
        out.phases["data"] = seconds

    # --- weight sync ----------------------------------------------------------------------------------
    link = intra if cluster.actor.tp * cluster.actor.pp * cluster.actor.cp <= per_node else inter
    out.phases["sync"] = weight_sync_seconds(
        plan.reshard,
        arch,
        link,
        profile.hbm_bandwidth.value,
        profile.measured.get("engine", {}),
        exchange_seconds(gpus, inter, intra, per_node, profile),
    )

    # --- control --------------------------------------------------------------------------------------
    if controller == "multi":
        out.phases["control"] = len(nodes) * allgather_seconds(gpus, inter, intra, per_node, profile)
    else:
        out.phases["control"] = sum(
            len(_ranks_of(mover.node_layouts[node.id])) * profile.rpc_latency.value for node in nodes
        )
    return out


def admission_of(cfg, engines: int, prompt_len: float) -> Admission:
    """How the rollout worker feeds its engine: with several engines, balanced chunks of prompt groups
    (workers/rollout/worker.py, _generate_chunks), one at a time where seeded samples depend on their
    batch mates (seeded_sampling's stand-in: CPU engines, or a GPU engine started with
    enable_custom_logit_processor and without enable_deterministic_inference); one engine gets the whole
    batch."""
    r = cfg.rollout
    if engines < 2:
        return Admission()
    stand_in = cfg.trainer.device == "cpu" or r.sglang.get("enable_custom_logit_processor", False)
    one_at_a_time = stand_in and not r.sglang.get("enable_deterministic_inference", False)
    est = r.balance_chunk_prompts * (prompt_len + r.n * r.max_new_tokens)
    return Admission(
        chunk_samples=r.balance_chunk_prompts * r.n,
        chunks_in_flight=chunks_in_flight(r.balance_outstanding_tokens, est, one_at_a_time),
    )


def reward_pool_seconds_per_sample(profile: Profile, num_workers: int) -> float:
    """A sample's share of a rank's scoring (multi-controller: every rank scores its own samples in its
    RewardPool): what --calibrate measured through a pool of that many workers (measured["reward"]: the
    pipe messages to and from a worker cost more than a small scorer itself), else the scorer's own
    time spread over knobs.reward_workers_per_rank workers."""
    measured = profile.measured.get("reward", {})
    if measured.get("reward_pool_workers") == num_workers:
        return measured["reward_pool_s_per_sample"]
    return profile.reward_seconds_per_sample.value / profile.knobs.reward_workers_per_rank


def cpu_contention(profile: Profile, trainers: int, engines: int, calibrated_with: int) -> float:
    """How much slower a CPU-bound Megatron pass runs in the job than where its cost was measured, on a
    host with fewer cores than busy processes (a CPU machine): the kernel shares the cores fairly, so N
    busy processes on C cores each get C / N of a core. In the job, `trainers` training processes run
    beside `engines` engine processes, and an engine with nothing to do still keeps
    measured["engine"]["idle_cpu_cores"] busy (SGLang's scheduler polls its sockets unless started with
    sleep_on_idle; --calibrate measures it); the measurement ran `calibrated_with` training processes
    alone. 1 without that measurement (GPU profiles: the passes run on the GPUs)."""
    idle = profile.measured.get("engine", {}).get("idle_cpu_cores", 0.0)
    if not idle:
        return 1.0
    cores = profile.cores.value

    def slowdown(busy: float) -> float:
        return max(1.0, busy / cores)

    return slowdown(trainers + engines * idle) / slowdown(calibrated_with)


def engine_contention(profile: Profile, engines: int) -> float:
    """How much slower each engine generates in the job than the one engine --calibrate timed alone, on a
    host with fewer cores than the engines' busy processes (a CPU machine): a generating engine keeps
    measured["engine"]["generating_cpu_cores"] busy (its scheduler, detokenizer and the owner's tokenizer
    manager), and `engines` of them share the cores fairly. Where --calibrate timed that many engines
    generating at once (measured["engine"]["slowdown_by_engines"]), that slowdown: they also share the
    memory bandwidth and caches. 1 without either measurement (GPU profiles)."""
    measured = profile.measured.get("engine", {}).get("slowdown_by_engines", {}).get(str(engines))
    if measured:
        return max(1.0, measured)
    busy = profile.measured.get("engine", {}).get("generating_cpu_cores", 0.0)
    if not busy:
        return 1.0
    cores = profile.cores.value
    return max(1.0, engines * busy / cores) / max(1.0, busy / cores)


def allgather_seconds(
    gpus: int, inter: Link, intra: Link, per_node: int, profile: Optional[Profile] = None
) -> float:
    """A small all-gather (or barrier) over `gpus` ranks: a ring's (ranks - 1) latencies, inter-node hops
    at the inter-node latency. On one host where --calibrate timed an all-gather of that many processes
    (profile.measured["gloo_by_ranks"]), that time: with more processes than cores each hop waits for
    its process to be scheduled, far more than a message's latency."""
    crowd = crowd_measurement(profile, gpus) if profile is not None and gpus <= per_node else None
    if crowd:
        return crowd["allgather_s"]
    nodes = max(1, math.ceil(gpus / per_node))
    return (min(gpus, per_node) - 1) * intra.latency + (nodes - 1) * inter.latency


def exchange_seconds(
    gpus: int, inter: Link, intra: Link, per_node: int, profile: Optional[Profile] = None
) -> float:
    """One all_gather_object of a small status over `gpus` ranks (the weight resharder's exchange): an
    all-gather of sizes and one of the pickled bytes; on one host where --calibrate timed it with that many
    processes, that time: inside a chain, from the last rank's arrival (measured["gloo_by_ranks"][N]
    ["allgather_object_chained_s"]), as the resharder's ranks arrive from their copies and the engine's
    load; from a barrier in calibrations before that measurement."""
    crowd = crowd_measurement(profile, gpus) if profile is not None and gpus <= per_node else None
    for key in ("allgather_object_chained_s", "allgather_object_s"):
        if crowd and key in crowd:
            return crowd[key]
    return 2 * allgather_seconds(gpus, inter, intra, per_node, profile)


def driver_of(profile: Profile) -> Driver:
    """A Ray-based single controller (verl's, the paper's baseline): every payload is pickled into the
    object store and unpickled by its reader (serialize_bandwidth: pickle.dumps + loads), each sample a
    Python object, each worker a remote call."""
    return Driver(
        pack_bandwidth=profile.serialize_bandwidth.value,
        nic_bandwidth=profile.driver_nic_bandwidth.value,
        per_object_s=profile.serialize_per_object.value,
        rpc_s=profile.rpc_latency.value,
    )


def _ranks_of(layout: PlacedLayout) -> tuple[int, ...]:
    return layout.ranks
