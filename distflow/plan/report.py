"""The dry-run plan: placement, layouts, per-GPU memory by phase, data plan and weight sync, as one object
(`build_plan`, pure) and as text (`render`). `python -m distflow.plan` prints it; the launch scripts in
examples/ run it with DRY_RUN=1.

Memory is estimated per phase of a step, on the worst pipeline stage of each role (an upper bound where
two roles peak on different stages), because colocated ranks hold different things at different times:
while engines generate, the Megatron roles' model states stay resident (unless offloaded) and the engine
sizes its KV pool from what is left; while a role trains, its activations come on top and the engines
have released their memory (rollout.release_memory_in_training); for the weight sync a released engine
resumes only its weights, and the sync's staging buffers come on top.
"""

import math
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from distflow.config.schema import DistFlowConfig
from distflow.dag.loading import RUNNABLE as RUNNABLE_PIPELINES
from distflow.dag.loading import load_pipeline
from distflow.dag.roles import ranks_of_role
from distflow.layout import ClusterLayout, ParallelLayout
from distflow.plan import diagnosis, memory
from distflow.plan.data_estimate import DataEstimate, estimate_data, micro_batch_tokens, micro_batches
from distflow.plan.memory import Activations, EngineMemory, GiB, ModelStates
from distflow.plan.model_size import ModelArch, engine_params_per_gpu, megatron_shard_params, padded_vocab
from distflow.plan.reshard_estimate import ReshardEstimate, estimate_reshard

ASSUMED_MEM_FRACTION = 0.85  # when rollout.mem_fraction_static is null (SGLang derives its own at start)
# DistFlow's Megatron worker builds Megatron's local layer spec today (unfused attention keeps its softmax);
# the Transformer Engine spec (flash attention) is what `--attention flash` plans for.
ATTENTION_TODAY = "unfused"
TRAINING_ROLES = ("actor", "critic")


@dataclass(frozen=True)
class RoleMemory:
    role: str
    layout: ParallelLayout
    stage: int
    """The pipeline stage with the largest footprint (the one reported)."""
    states: ModelStates
    activations: Optional[Activations]
    offload: bool

    @property
    def resident(self) -> float:
        """What the role keeps on the GPU while another node runs."""
        return 0.0 if self.offload else self.states.total

    @property
    def peak(self) -> float:
        return self.states.total + (self.activations.total if self.activations else 0.0)


class Part(NamedTuple):
    """One thing a phase holds on a GPU."""

    label: str
    bytes: float
    kind: str
    """states | activations (of `role`) | engine (weights + KV pool) | engine_weights | engine_kept | staging"""
    role: Optional[str] = None


@dataclass(frozen=True)
class Phase:
    name: str
    where: str
    parts: tuple[Part, ...]

    @property
    def total(self) -> float:
        return sum(p.bytes for p in self.parts)


@dataclass
class Plan:
    cfg: DistFlowConfig
    arch: ModelArch
    arch_source: str
    cluster: ClusterLayout
    gpu_bytes: float
    gpus_per_node: int
    attention: str
    pipeline_order: list[str]
    roles: dict[str, RoleMemory]
    engine: EngineMemory
    mem_fraction: float
    phases: list[Phase]
    data: DataEstimate
    reshard: ReshardEstimate
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    shortfalls: list = field(default_factory=list)
    """diagnosis.Shortfall of each phase that does not fit (largest first); empty: the plan fits."""

    @property
    def fits(self) -> bool:
        return not self.shortfalls


def role_memory(
    cfg: DistFlowConfig, arch: ModelArch, role: str, layout: ParallelLayout, attention: str = ATTENTION_TODAY
) -> RoleMemory:
    """The worst pipeline stage of `role`: model states plus (training roles) activations."""
    rc = getattr(cfg, role)
    trains = role in TRAINING_ROLES
    max_seq_len = cfg.data.max_prompt_length + cfg.rollout.max_new_tokens
    expert_dp = layout.world_size // (layout.pp * layout.ep * layout.etp)
    best = None
    for stage in sorted({0, layout.pp - 1}):
        params = megatron_shard_params(
            arch, layout.tp, layout.pp, layout.ep, layout.etp, stage, value_head=role == "critic"
        )
        states = memory.model_state_bytes(
            params,
            cfg.model.dtype,
            trains,
            trains and rc.optim.use_distributed_optimizer,
            dense_dp=layout.dp * layout.cp,
            expert_dp=expert_dp,
            cpu_offload_fraction=memory.optimizer_cpu_offload_fraction(rc.optim) if trains else 0.0,
        )
        acts = None
        if trains:
            acts = memory.activation_bytes(
                arch,
                tokens=micro_batch_tokens(rc, max_seq_len),
                tp=layout.tp,
                pp=layout.pp,
                vpp=layout.vpp,
                cp=layout.cp,
                etp=layout.etp,
                sequence_parallel=rc.sequence_parallel,
                recompute=rc.recompute_granularity,
                recompute_method=rc.recompute_method,
                recompute_num_layers=rc.recompute_num_layers,
                micro_batches=micro_batches(
                    rc, cfg.data.train_batch_size, cfg.rollout.n, layout.dp, max_seq_len
                ),
                stage=stage,
                padded_vocab=padded_vocab(arch.vocab_size, layout.tp),
                value_head=role == "critic",
                seq_len=max_seq_len if attention == "unfused" else None,
            )
        candidate = RoleMemory(role, layout, stage, states, acts, rc.offload)
        if best is None or candidate.peak > best.peak:
            best = candidate
    return best


def build_plan(
    cfg: DistFlowConfig,
    world_size: int,
    arch: ModelArch,
    gpu_memory_gb: float,
    bandwidth_gbps: float = 400.0,
    gpus_per_node: int = 8,
    arch_source: str = "",
    attention: str = ATTENTION_TODAY,
) -> Plan:
    """Validates the layouts against the world size and the model (LayoutError), then estimates."""
    cluster = ClusterLayout.from_config(cfg, world_size, arch.shape())
    p = cluster.placement
    rank_roles = ranks_of_role(cluster)
    order = [
        node.id
        for node in load_pipeline(cfg).validate(
            roles_with_ranks=[r for r, ranks in rank_roles.items() if ranks]
        )
    ]
    gpu = gpu_memory_gb * GiB
    roles = {
        r: role_memory(cfg, arch, r, getattr(cluster, r), attention)
        for r in ("actor", "ref", "critic")
        if getattr(cluster, r) is not None
    }
    colocated = p.kind == "colocated"
    resident = sum(m.resident for m in roles.values()) if colocated else 0.0
    fraction = cfg.rollout.mem_fraction_static or ASSUMED_MEM_FRACTION
    engine = memory.engine_memory(
        gpu,
        fraction,
        2 * engine_params_per_gpu(arch, p.engine_tp),
        resident,
        memory.kv_bytes_per_token(arch, p.engine_tp),
    )
    data = estimate_data(cfg, p.num_engines, cluster.actor.dp)
    plan = Plan(
        cfg=cfg,
        arch=arch,
        arch_source=arch_source,
        cluster=cluster,
        gpu_bytes=gpu,
        gpus_per_node=gpus_per_node,
        attention=attention,
        pipeline_order=order,
        roles=roles,
        engine=engine,
        mem_fraction=fraction,
        phases=[],
        data=data,
        reshard=estimate_reshard(
            arch, cluster.actor, p.num_engines, p.engine_tp, cfg.sync.bucket_mb, bandwidth_gbps
        ),
    )
    plan.phases = _phases(plan, colocated)
    _check(plan, colocated, RUNNABLE_PIPELINES)
    return plan


def _phases(plan: Plan, colocated: bool) -> list[Phase]:
    r = plan.cfg.rollout
    engine_during_training = 0.0 if r.release_memory_in_training else plan.engine.static_total
    train_where = "every rank" if colocated else "training ranks"

    def states(m: RoleMemory, resident: bool = True) -> Part:
        offloaded = resident and m.offload
        return Part(
            f"{m.role} states" + (" (offloaded)" if offloaded else ""),
            m.resident if resident else m.states.total,
            "states",
            m.role,
        )

    phases = []
    # Negative when the resident states alone exceed the GPU (the engine cannot start): counted as nothing.
    engine = Part("engine weights + KV pool", max(0.0, plan.engine.static_total), "engine")
    parts = ([states(m) for m in plan.roles.values()] + [engine]) if colocated else [engine]
    where = train_where if colocated else "rollout ranks"
    phases.append(Phase("generate", where, tuple(parts)))
    # A released engine resumes only its weights for the sync (the KV cache returns at generation).
    staging = Part("sync staging", plan.reshard.staging_bytes, "staging")
    if colocated and r.release_memory_in_training:
        sync_parts = tuple(parts[:-1]) + (
            Part("engine weights", plan.engine.weights, "engine_weights"),
            staging,
        )
    else:
        sync_parts = tuple(parts) + (staging,)
    phases.append(Phase("sync_weights", where, sync_parts))
    for role in TRAINING_ROLES:
        if role not in plan.roles:
            continue
        m = plan.roles[role]
        parts = [
            states(m, resident=False),
            Part(f"{role} activations", m.activations.total, "activations", role),
        ]
        parts += [states(o) for o in plan.roles.values() if o.role != role]
        if colocated:
            parts.append(
                Part(
                    "engine" + (" (released)" if r.release_memory_in_training else " (kept)"),
                    engine_during_training,
                    "engine_kept",
                )
            )
        phases.append(Phase(f"train_{role}", train_where, tuple(parts)))
    return phases


def _check(plan: Plan, colocated: bool, runnable_pipelines) -> None:
    cfg = plan.cfg
    w, n = plan.warnings, plan.notes

    def reestimate(changed_cfg, role):
        return role_memory(changed_cfg, plan.arch, role, getattr(plan.cluster, role), plan.attention)

    plan.shortfalls = diagnosis.shortfalls(plan, reestimate)
    described: set = set()
    w.extend(diagnosis.describe(s, described) for s in plan.shortfalls)
    if plan.arch.unsupported:
        w.append(f"DistFlow's model family spec refuses this checkpoint today: {plan.arch.unsupported}")
    n.extend(plan.data.notes)
    p = plan.cluster.placement
    if p.engine_tp > plan.gpus_per_node:
        spans = -(-p.engine_tp // plan.gpus_per_node)
        n.append(
            f"an engine spans {spans} nodes (engine TP {p.engine_tp} > {plan.gpus_per_node} GPUs per "
            "node): a multi-node SGLang engine, its TP traffic crosses nodes"
        )
        if p.engine_nnodes != spans:
            w.append(
                f"rollout.engine_nnodes={p.engine_nnodes} but each engine spans {spans} nodes of "
                f"{plan.gpus_per_node} GPUs: set rollout.engine_nnodes={spans}"
            )
    elif p.engine_nnodes > 1:
        w.append(
            f"rollout.engine_nnodes={p.engine_nnodes} splits engines of TP {p.engine_tp} that fit one node "
            f"of {plan.gpus_per_node} GPUs: set rollout.engine_nnodes=1"
        )
    for m in plan.roles.values():
        if m.layout.tp > plan.gpus_per_node:
            n.append(
                f"{m.role}.tp={m.layout.tp} spans nodes ({plan.gpus_per_node} GPUs per node): TP traffic "
                "crosses the network"
            )
        if m.offload:
            n.append(f"{m.role}.offload=true: no worker offloads yet; the estimate assumes it will")
    if plan.attention == "unfused" and any(m.activations for m in plan.roles.values()):
        n.append(
            "activations assume unfused attention (the softmax is kept: Megatron's local layer spec, which "
            "the Megatron worker builds today); --attention flash plans for Transformer Engine's flash attention"
        )
    if cfg.rollout.mem_fraction_static is None:
        n.append(
            f"rollout.mem_fraction_static is null: SGLang chooses one at start; {ASSUMED_MEM_FRACTION} assumed"
        )
    if cfg.dag.pipeline not in runnable_pipelines and ":" not in cfg.dag.pipeline:
        n.append(
            f"distflow.train cannot run dag.pipeline={cfg.dag.pipeline} yet (the RL trainer is coming; "
            f"runnable today: {sorted(runnable_pipelines)})"
        )


def _gib(x: float) -> str:
    return f"{x / GiB:.1f}"


def _span(ranks) -> str:
    ranks = list(ranks)
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])


def _nodes(ranks, per_node: int) -> str:
    first, last = ranks[0] // per_node, ranks[-1] // per_node
    return f"node {first}" if first == last else f"nodes {first}-{last}"


def render(plan: Plan) -> str:
    cfg, a, c, d, e, s = plan.cfg, plan.arch, plan.cluster, plan.data, plan.engine, plan.reshard
    p = c.placement
    nodes = -(-p.world_size // plan.gpus_per_node)
    out = [
        f"DistFlow plan: world size {p.world_size} ({nodes} node(s) x {plan.gpus_per_node} GPUs), "
        f"GPU memory {plan.gpu_bytes / GiB:.0f} GiB, link {s.bandwidth_bytes_s * 8 / 1e9:.0f} Gbit/s per GPU",
        f"model: {a.describe()}" + (f"  [{plan.arch_source}]" if plan.arch_source else ""),
        "",
        "== placement and layouts",
    ]
    if p.kind == "colocated":
        out.append(f"colocated: every rank (0-{p.world_size - 1}) trains and hosts a share of an engine")
    else:
        per_node = plan.gpus_per_node
        out.append(
            f"disaggregated: training ranks {_span(p.train_ranks)} ({_nodes(p.train_ranks, per_node)}), "
            f"engine ranks {_span(p.rollout_ranks)} ({_nodes(p.rollout_ranks, per_node)})"
        )
    engines = [_span(p.engine_ranks(k)) for k in range(p.num_engines)]
    if len(engines) > 4:
        engines = engines[:2] + ["..."] + engines[-1:]
    out.append(f"rollout: {p.num_engines} SGLang engine(s) x TP {p.engine_tp}, on ranks {', '.join(engines)}")
    for role in ("actor", "ref", "critic"):
        layout = getattr(c, role)
        if layout is None:
            out.append(f"{role}: off")
            continue
        expert_dp = layout.world_size // (layout.pp * layout.ep * layout.etp)
        extra = f", expert DP {expert_dp}" if a.is_moe else ""
        out.append(
            f"{role}: {layout.describe()} on ranks {_span(p.train_ranks)} (TP fastest, PP slowest{extra})"
        )
    out.append(f"pipeline {cfg.dag.pipeline}: {' -> '.join(plan.pipeline_order)}")

    out += [
        "",
        f"== memory per GPU (GiB), worst pipeline stage; {cfg.model.dtype} weights, fp32 grads, "
        f"{'fp32 master + ' if cfg.model.dtype != 'float32' else ''}Adam m, v",
    ]
    for m in plan.roles.values():
        st = m.states
        line = f"{m.role:<7} stage {m.stage}: weights {_gib(st.weights)}"
        if st.grads:
            dist_opt = getattr(cfg, m.role).optim.use_distributed_optimizer
            line += f"  grads {_gib(st.grads)}  optimizer {_gib(st.optimizer)} " + (
                f"(distributed over DP; {_gib(st.optimizer_unsharded)} without)"
                if dist_opt
                else "(not distributed)"
            )
            offloaded = memory.optimizer_cpu_offload_fraction(getattr(cfg, m.role).optim)
            if offloaded:
                line += f" ({offloaded:.0%} of it in CPU memory: optimizer_cpu_offload)"
        else:
            line += "  (forward only)"
        if m.activations:
            act = m.activations
            rc = getattr(cfg, m.role)
            line += f"  activations {_gib(act.total)}"
            out.append(line)
            out.append(
                f"        activations = {_gib(act.stored_per_microbatch)} per micro-batch x {act.in_flight:g} "
                f"in flight + recompute working set {_gib(act.recompute_working)} + logits {_gib(act.logits)} "
                f"({micro_batch_tokens(rc, d.max_seq_len)} tokens per micro-batch, one layer keeps "
                f"{_gib(act.per_layer)}, recompute={rc.recompute_granularity or 'none'}, "
                f"sequence_parallel={rc.sequence_parallel}, {plan.attention} attention)"
            )
        else:
            out.append(line)
    per_token = memory.kv_bytes_per_token(a, p.engine_tp)
    at_once, share = e.kv_tokens // d.max_seq_len, d.samples / d.num_engines
    out.append(
        f"engine : weights {_gib(e.weights)}  KV cache {_gib(max(e.kv_cache, 0))} = {e.kv_tokens:,} tokens "
        f"({per_token / 1024:.0f} KiB per token per GPU) = {at_once:,} full-length samples at once; an "
        f"engine's share of a step is {share:g} samples"
        + (f" (>= {math.ceil(share / at_once)} waves at full length)" if 0 < at_once < share else "")
    )
    out.append(
        f"         KV = mem_fraction_static {plan.mem_fraction} x free at start "
        f"{_gib(e.static_total / plan.mem_fraction)} - weights {_gib(e.weights)}; the rest of the free "
        "memory is SGLang's runtime slack (activations, CUDA graphs)"
    )
    for phase in plan.phases:
        verdict = "OVER" if phase.total > plan.gpu_bytes else "ok"
        parts = " + ".join(f"{part.label} {_gib(part.bytes)}" for part in phase.parts)
        out.append(
            f"phase {phase.name:<13} ({phase.where}): {parts} = {_gib(phase.total)} / "
            f"{plan.gpu_bytes / GiB:.0f}  {verdict}"
        )

    out += [
        "",
        "== data plan (one step; token counts at full length: upper bounds)",
        f"{d.prompts} prompts x n={d.samples_per_prompt} = {d.samples} samples, up to {d.max_seq_len} tokens each "
        f"({d.max_tokens:,} tokens)",
        f"rollout: {d.prompts_per_engine:g} prompts ({d.prompts_per_engine * d.samples_per_prompt:g} samples) "
        f"per engine (rollout DP rank, {d.num_engines} in all)",
        f"training: {d.samples_per_train_dp:g} samples (<= {d.max_tokens_per_train_dp:,.0f} tokens) per actor DP "
        f"rank ({d.train_dp} in all); {d.mini_batches} mini-batch(es) x {d.ppo_epochs} epoch(s) = "
        f"{d.mini_batches * d.ppo_epochs} optimizer step(s); <= {d.micro_batches} micro-batches of "
        f"{d.tokens_per_micro_batch} tokens per mini-batch per DP rank",
    ]

    out += [
        "",
        f"== weight sync (bf16, sync.bucket_mb={cfg.sync.bucket_mb:g} MiB)",
        f"one model copy {_gib(s.model_bytes)} GiB = {s.model_buckets} buckets; {s.num_engines} engine(s) need "
        f"{_gib(s.total_bytes)} GiB in all",
        f"each training rank sends <= {_gib(s.send_bytes)} GiB ({s.sender_buckets} buckets; busiest: pipeline "
        f"stage {s.send_stage}); each engine rank receives {_gib(s.recv_bytes)} GiB",
        f"lower bound {s.seconds_lower_bound:.2f} s at {s.bandwidth_bytes_s * 8 / 1e9:.0f} Gbit/s per GPU "
        "(busier side / link"
        + ("; a colocated rank's own slice is a local copy)" if p.kind == "colocated" else ")"),
    ]
    if plan.notes:
        out += [""] + [f"note: {x}" for x in plan.notes]
    if plan.warnings:
        out += [""] + [f"WARNING: {x}" for x in plan.warnings]
    if plan.fits:
        out += ["", "fits: every phase within the GPU's memory"]
    else:
        out += [
            "",
            f"DOES NOT FIT: {len(plan.shortfalls)} shortfall(s) above; the largest cause is named first",
        ]
    return "\n".join(out)
