"""Why a plan does not fit, largest cause first, and the knobs that would make it fit (pure, like the plan).

A shortfall is a phase whose parts exceed the GPU, or an engine that cannot start (its weights do not fit
its share of the memory the colocated Megatron states leave) or whose KV cache holds less than one
full-length sample. Its causes are the phase's parts ranked by size; each comes with the remedies that
apply to it and are not already applied (recompute only if it is off, the distributed optimizer only if
it is off, ...), ranked by what they save. Where a remedy is a config change the saving is the estimate
recomputed with that change (`reestimate`); tp/pp/engine_tp changes are stated as the halving they give.
"""

import dataclasses
from dataclasses import dataclass
from typing import Callable

from distflow.plan.data_estimate import micro_batch_tokens
from distflow.plan.memory import GiB, kv_bytes_per_token, optimizer_cpu_offload_fraction

MAX_CAUSES = 3  # the largest causes a warning names; the rest are small next to them


@dataclass(frozen=True)
class Remedy:
    change: str
    saves: float
    """Bytes per GPU it frees in the phase (an estimate)."""


@dataclass(frozen=True)
class Cause:
    label: str
    bytes: float
    detail: str
    remedies: tuple[Remedy, ...]


@dataclass(frozen=True)
class Shortfall:
    what: str
    where: str
    need: float
    available: float
    causes: tuple[Cause, ...]

    @property
    def over(self) -> float:
        return self.need - self.available


def shortfalls(plan, reestimate: Callable) -> list:
    """Every Shortfall of `plan`, the largest overshoot first. reestimate(cfg, role) -> RoleMemory: the
    role's memory under a changed config (report.role_memory on the plan's model and layout)."""
    found = []
    for phase in plan.phases:
        if phase.total > plan.gpu_bytes:
            causes = [_cause(plan, part, reestimate) for part in phase.parts if part.bytes > 0]
            where = phase.where
            if phase.name.startswith("train_"):  # the role's worst pipeline stage is the one estimated
                where += f" (pipeline stage {plan.roles[phase.name[len('train_') :]].stage})"
            found.append(
                Shortfall(
                    f"phase {phase.name}",
                    where,
                    phase.total,
                    plan.gpu_bytes,
                    tuple(sorted(causes, key=lambda c: -c.bytes)),
                )
            )
    found += _engine_shortfalls(plan, reestimate)
    return sorted(found, key=lambda s: -s.over)


def describe(s: Shortfall, described: set | None = None) -> str:
    """One line: what does not fit by how much, then each of the largest causes with its remedies.
    described: labels of causes an earlier line explained (their remedies are not repeated); updated."""
    described = set() if described is None else described
    head = (
        f"does not fit: {s.what} needs {s.need / GiB:.1f} GiB per GPU on {s.where}, {s.over / GiB:.1f} GiB "
        f"over the {s.available / GiB:.1f} GiB available. Largest first: "
    )
    parts = []
    for c in s.causes[:MAX_CAUSES]:
        if c.label in described:
            parts.append(f"{c.label} {c.bytes / GiB:.1f} GiB (remedies above)")
            continue
        described.add(c.label)
        text = f"{c.label} {c.bytes / GiB:.1f} GiB" + (f" ({c.detail})" if c.detail else "")
        remedies = sorted(c.remedies, key=lambda r: -r.saves)
        text += (
            ": " + ", or ".join(f"{r.change} (-{r.saves / GiB:.1f} GiB)" for r in remedies)
            if remedies
            else ": no knob in this plan"
        )
        parts.append(text)
    return head + "; ".join(parts)


def _cause(plan, part, reestimate) -> Cause:
    if part.kind in ("states", "activations"):
        return _role_cause(plan, part, reestimate)
    remedies = []
    # (The generating engine's "weights + KV pool" is a share of what the other parts leave: never the cause.)
    if part.kind == "engine_weights":
        remedies.append(
            Remedy(
                f"raise rollout.engine_tp (now {plan.cluster.placement.engine_tp}; x2 halves it)",
                part.bytes / 2,
            )
        )
    elif part.kind == "engine_kept":
        remedies.append(Remedy("rollout.release_memory_in_training=true", part.bytes))
    elif part.kind == "staging":
        remedies.append(
            Remedy(f"lower sync.bucket_mb (now {plan.cfg.sync.bucket_mb:g}; /2 halves it)", part.bytes / 2)
        )
    return Cause(part.label, part.bytes, "", tuple(remedies))


def _role_cause(plan, part, reestimate) -> Cause:
    role, cfg = part.role, plan.cfg
    m, rc = plan.roles[role], getattr(cfg, role)
    layout = m.layout
    remedies = []

    def saving(**changes) -> float:
        new = reestimate(dataclasses.replace(cfg, **{role: dataclasses.replace(rc, **changes)}), role)
        if part.kind == "states":
            return m.states.total - new.states.total
        return m.activations.total - new.activations.total

    if part.kind == "states":
        st = m.states
        detail = f"weights {st.weights / GiB:.1f} + grads {st.grads / GiB:.1f} + optimizer {st.optimizer / GiB:.1f}"
        if not st.grads:
            detail = "weights, forward only"
            if not rc.offload:
                remedies.append(
                    Remedy(f"{role}.offload=true (kept in CPU memory between forwards)", part.bytes)
                )
        halved = (
            st.weights / 2
            + st.grads / 2
            + (0.0 if st.grads and rc.optim.use_distributed_optimizer else st.optimizer / 2)
        )
        what = "the weights and grads" if st.grads else "the weights"
        now = f"tp={layout.tp} pp={layout.pp}" + (f" ep={layout.ep}" if plan.arch.is_moe else "")
        remedies.append(Remedy(f"raise {_layout_knob(plan, role)} (now {now}; x2 halves {what})", halved))
        if st.grads:
            if not rc.optim.use_distributed_optimizer:
                optim = dataclasses.replace(rc.optim, use_distributed_optimizer=True)
                remedies.append(Remedy(f"{role}.optim.use_distributed_optimizer=true", saving(optim=optim)))
            if optimizer_cpu_offload_fraction(rc.optim) < 1.0 and st.optimizer > 0:
                megatron = {
                    **rc.optim.megatron,
                    "optimizer_cpu_offload": True,
                    "optimizer_offload_fraction": 1.0,
                }
                optim = dataclasses.replace(rc.optim, megatron=megatron)
                remedies.append(
                    Remedy(
                        f"{role}.optim.megatron={{optimizer_cpu_offload: true, "
                        "optimizer_offload_fraction: 1.0}",
                        saving(optim=optim),
                    )
                )
        return Cause(part.label, part.bytes, detail, tuple(r for r in remedies if r.saves > 0))
    act = m.activations
    detail = (
        f"{act.stored_per_microbatch / GiB:.1f} stored x {act.in_flight:g} in flight + recompute "
        f"{act.recompute_working / GiB:.1f} + logits {act.logits / GiB:.1f}"
    )
    if rc.recompute_granularity != "full":
        remedies.append(
            Remedy(
                f"{role}.recompute_granularity=full recompute_method=uniform recompute_num_layers=1",
                saving(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
            )
        )
    if layout.tp > 1 and not rc.sequence_parallel:
        remedies.append(Remedy(f"{role}.sequence_parallel=true", saving(sequence_parallel=True)))
    max_seq_len = cfg.data.max_prompt_length + cfg.rollout.max_new_tokens
    tokens = micro_batch_tokens(rc, max_seq_len)
    if rc.use_dynamic_batch and tokens > max_seq_len:
        smaller = max(max_seq_len, tokens // 2)
        remedies.append(
            Remedy(
                f"lower {role}.max_tokens_per_micro_batch (now {tokens}) to {smaller}",
                saving(max_tokens_per_micro_batch=smaller),
            )
        )
    elif not rc.use_dynamic_batch and rc.micro_batch_size > 1:
        smaller = rc.micro_batch_size // 2
        remedies.append(
            Remedy(
                f"lower {role}.micro_batch_size (now {rc.micro_batch_size}) to {smaller}",
                saving(micro_batch_size=smaller),
            )
        )
    remedies.append(
        Remedy(f"raise {_layout_knob(plan, role, 'tp')} (now {layout.tp}; x2 halves them)", act.total / 2)
    )
    return Cause(part.label, part.bytes, detail, tuple(r for r in remedies if r.saves > 0))


def _layout_knob(plan, role: str, which: str = "tp or pp") -> str:
    """How to change a role's layout: every Megatron role shares the actor's (one set of process groups)."""
    sizes = ["tp", "pp"] if which == "tp or pp" else [which]
    if plan.arch.is_moe and which == "tp or pp":
        sizes.append("ep")
    others = [r for r in plan.roles if r != "actor"]
    return " or ".join(f"actor.{s}" for s in sizes) + (f" ({'/'.join(others)} alike)" if others else "")


def _engine_shortfalls(plan, reestimate) -> list:
    """The engine cannot start (weights over its share) or cannot hold one full-length sample: SGLang gets
    mem_fraction_static x (GPU - resident Megatron states) for weights + KV."""
    e, fraction = plan.engine, plan.mem_fraction
    kv_one_sample = kv_bytes_per_token(plan.arch, plan.cluster.placement.engine_tp) * plan.data.max_seq_len
    if e.kv_cache > 0 and e.kv_tokens >= plan.data.max_seq_len:
        return []
    what = (
        "the engine's start (its weights do not fit its share)"
        if e.kv_cache <= 0
        else f"the engine's KV cache ({e.kv_tokens} tokens, less than one {plan.data.max_seq_len}-token sample)"
    )
    parts = [p for p in plan.phases[0].parts if p.kind == "states" and p.bytes > 0]
    need = sum(p.bytes for p in parts) + (e.weights + kv_one_sample) / fraction
    causes = [_cause(plan, p, reestimate) for p in parts]
    engine_remedies = [
        Remedy(
            f"raise rollout.engine_tp (now {plan.cluster.placement.engine_tp}; x2 halves them)",
            e.weights / 2 / fraction,
        )
    ]
    if fraction < 0.9:
        engine_remedies.append(
            Remedy(
                f"raise rollout.mem_fraction_static (now {fraction}) to 0.9",
                (0.9 - fraction) * (e.static_total / fraction),
            )
        )
    causes.append(
        Cause(
            f"engine weights / mem_fraction_static {fraction}",
            e.weights / fraction,
            f"weights {e.weights / GiB:.1f}",
            tuple(r for r in engine_remedies if r.saves > 0),
        )
    )
    where = "every rank" if plan.cluster.placement.kind == "colocated" else "rollout ranks"
    return [Shortfall(what, where, need, plan.gpu_bytes, tuple(sorted(causes, key=lambda c: -c.bytes)))]
