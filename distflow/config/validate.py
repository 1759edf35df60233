"""Checks that need more than one field, and the pass-through keys against Megatron-Core and SGLang.

Runs before any process group exists. Layout checks against world size and the model live in
distflow.layout; here only what the config alone can tell.
"""

import contextlib
import dataclasses
import functools
import warnings

from distflow.config.algorithm import ESTIMATORS, KL_IN_REWARD_ESTIMATORS
from distflow.config.loader import ConfigError, unknown_key_message
from distflow.config.ranges import check_ranges
from distflow.config.schema import DistFlowConfig
from distflow.cpu_support import cuda_available, sglang_cpu_launch

# Pass-through keys that DistFlow derives from its own fields: setting them twice would disagree silently.
_MEGATRON_OWNED = {
    "tensor_model_parallel_size": "tp",
    "pipeline_model_parallel_size": "pp",
    "context_parallel_size": "cp",
    "expert_model_parallel_size": "ep",
    "expert_tensor_parallel_size": "etp",
    "virtual_pipeline_model_parallel_size": "vpp",
    "sequence_parallel": "sequence_parallel",
    "recompute_granularity": "recompute_granularity",
    "recompute_method": "recompute_method",
    "recompute_num_layers": "recompute_num_layers",
}
# OptimizerConfig fields DistFlow sets from optim.* and model.dtype.
_MEGATRON_OPTIMIZER_OWNED = {
    "optimizer": "(always adam)",
    "lr": "optim.lr",
    "min_lr": "optim.min_lr",
    "weight_decay": "optim.weight_decay",
    "adam_beta1": "optim.adam_beta1",
    "adam_beta2": "optim.adam_beta2",
    "adam_eps": "optim.adam_eps",
    "clip_grad": "optim.clip_grad",
    "use_distributed_optimizer": "optim.use_distributed_optimizer",
    "bf16": "model.dtype",
    "fp16": "model.dtype",
    "params_dtype": "model.dtype",
}
_SGLANG_OWNED = {
    "model_path": "model.path",
    "tokenizer_path": "model.tokenizer_path",
    "tp_size": "rollout.engine_tp",
    "dtype": "model.dtype",
    "mem_fraction_static": "rollout.mem_fraction_static",
    "random_seed": "trainer.seed",
    "dp_size": "rollout.num_ranks / rollout.engine_tp",
    "nnodes": "rollout.engine_nnodes",
    "node_rank": "rollout.engine_nnodes",
    "dist_init_addr": "rollout.engine_nnodes",
    "enable_return_routed_experts": "actor.moe_routing_replay",
}
TRACKING_BACKENDS = ("console", "jsonl", "wandb", "tensorboard")


def validate(cfg: DistFlowConfig, check_passthrough: bool = True) -> DistFlowConfig:
    """Raises ConfigError on the first inconsistency; returns cfg unchanged otherwise."""
    for role in ("actor", "critic", "ref"):
        _validate_role(role, getattr(cfg, role), cfg.parallel_sizes(role))
    r = cfg.rollout
    if r.placement == "colocated" and r.num_ranks != 0:
        raise ConfigError(
            f"rollout.num_ranks={r.num_ranks} only applies to placement=disaggregated; "
            "colocated engines use every rank (set rollout.num_ranks=0)"
        )
    if r.placement == "disaggregated" and r.num_ranks < 1:
        raise ConfigError(
            "rollout.placement=disaggregated needs rollout.num_ranks >= 1 (ranks hosting engines)"
        )
    _positive("rollout.engine_tp", r.engine_tp)
    _positive("rollout.n", r.n)
    _positive("rollout.balance_chunk_prompts", r.balance_chunk_prompts)
    _positive("rollout.balance_outstanding_tokens", r.balance_outstanding_tokens)
    if r.balance_timeout_s is not None:
        _positive("rollout.balance_timeout_s", r.balance_timeout_s)
    if r.call_timeout_s is not None:
        _positive("rollout.call_timeout_s", r.call_timeout_s)
    if r.engine_restarts < 0:
        raise ConfigError(
            f"rollout.engine_restarts={r.engine_restarts} must be >= 0 (0: an engine death stops the job)"
        )
    if r.engine_nnodes < 1 or r.engine_tp % r.engine_nnodes:
        raise ConfigError(
            f"rollout.engine_nnodes={r.engine_nnodes} must be >= 1 and divide rollout.engine_tp="
            f"{r.engine_tp} (each node holds engine_tp / engine_nnodes of an engine's ranks)"
        )
    _positive("rollout.max_new_tokens", r.max_new_tokens)
    _positive("rollout.max_turns", r.max_turns)
    if r.max_total_tokens is not None:
        _positive("rollout.max_total_tokens", r.max_total_tokens)
    if r.env_timeout_s <= 0:
        raise ConfigError(f"rollout.env_timeout_s={r.env_timeout_s} must be > 0")
    if r.max_turns > 1 and r.env is None:
        raise ConfigError(
            f"rollout.max_turns={r.max_turns} needs rollout.env: between turns an environment answers the policy "
            "(e.g. rollout.env=calculator)"
        )
    if cfg.reward.env_reward_coef and r.env is None:
        raise ConfigError(
            f"reward.env_reward_coef={cfg.reward.env_reward_coef} needs rollout.env: the per-step rewards it "
            "weighs come from an environment (or set it to 0)"
        )
    if cfg.reward.env_reward_coef and cfg.reward.model_path is not None:
        raise ConfigError(
            "reward.env_reward_coef applies to the scorer's rewards (reward.name, reward.custom), not to "
            f"reward.model_path={cfg.reward.model_path}; set one of them"
        )
    if not 0 < r.top_p <= 1:
        raise ConfigError(f"rollout.top_p={r.top_p} must be in (0, 1]")
    if r.temperature < 0:
        raise ConfigError(f"rollout.temperature={r.temperature} must be >= 0")
    if not cfg.sync.bucket_mb * 2**20 >= 1024:
        raise ConfigError(f"sync.bucket_mb={cfg.sync.bucket_mb} must be at least 1 KiB (0.001 MiB)")
    _positive("data.train_batch_size", cfg.data.train_batch_size)
    check_ranges(cfg)
    _check_estimator(cfg)
    _check_staleness(cfg)
    _check_rollout_correction(cfg)
    if cfg.actor.moe_routing_replay:
        _check_routing_replay(cfg)
    for i, backend in enumerate(cfg.tracking.backends):
        if backend not in TRACKING_BACKENDS:
            raise ConfigError(f"tracking.backends[{i}]={backend!r} is not one of {list(TRACKING_BACKENDS)}")
    if check_passthrough:
        for role in ("actor", "critic", "ref"):
            _validate_keys(
                f"{role}.megatron", getattr(cfg, role).megatron, megatron_fields, _MEGATRON_OWNED, f"{role}."
            )
            if role != "ref":
                _validate_keys(
                    f"{role}.optim.megatron",
                    getattr(cfg, role).optim.megatron,
                    megatron_optimizer_fields,
                    _MEGATRON_OPTIMIZER_OWNED,
                    "",
                )
        _validate_keys("rollout.sglang", r.sglang, sglang_fields, _SGLANG_OWNED, "")
    return cfg


def _check_estimator(cfg: DistFlowConfig) -> None:
    """algorithm.adv_estimator against the critic and the KL settings, whatever the pipeline (the built-in
    pipelines' own estimator tables are checked with them: distflow.dag.builtin)."""
    a = cfg.algorithm
    estimator = ESTIMATORS[a.adv_estimator]
    if estimator.needs_critic and not cfg.critic.enable:
        raise ConfigError(f"algorithm.adv_estimator={estimator.name} needs a critic: set critic.enable=true")
    if a.kl_in_reward and a.kl_coef > 0 and not estimator.kl_in_reward:
        raise ConfigError(
            f"algorithm.kl_in_reward=true needs a token-level estimator {list(KL_IN_REWARD_ESTIMATORS)}; "
            f"with adv_estimator={a.adv_estimator!r} use the KL as a loss term (kl_in_reward=false)"
        )
    if a.kl_coef > 0 and not cfg.ref.enable:
        raise ConfigError(
            f"algorithm.kl_coef={a.kl_coef} needs the reference model: set ref.enable=true, or "
            "algorithm.kl_coef=0 to train without a KL term"
        )


def _check_staleness(cfg: DistFlowConfig) -> None:
    """rollout.max_staleness against what the rollout of a future step may not wait for (docs/async.md)."""
    r, a = cfg.rollout, cfg.algorithm
    if r.max_staleness < 0:
        raise ConfigError(
            f"rollout.max_staleness={r.max_staleness} must be >= 0 (0: lock-step, k: samples up to k "
            "weight versions old)"
        )
    if r.stream_chunks < 1:
        raise ConfigError(
            f"rollout.stream_chunks={r.stream_chunks} must be >= 1 (1: the samples move whole after "
            "generation; k: in k parts, k - 1 of them while the engines generate)"
        )
    if r.partial:
        _check_partial(cfg)
    if r.max_staleness == 0:
        return
    if a.dynamic_sampling:
        raise ConfigError(
            f"rollout.max_staleness={r.max_staleness} with algorithm.dynamic_sampling=true: DAPO's dynamic "
            "sampling decides 'enough groups?' with a collective over every rank in the middle of the "
            "rollout, so a future step's rollout would hold the trainer up and nothing could overlap; use "
            "rollout.max_staleness=0 with dynamic sampling, or dag.pipeline=grpo asynchronously"
        )
    estimator = ESTIMATORS[a.adv_estimator]
    # An outcome advantage is computed where the samples were scored (unless a reward model scores them in
    # the training layout): inside the rollout of a future step.
    in_rollout = estimator.kind == "outcome" and not cfg.reward.model_path
    if r.placement == "disaggregated" and in_rollout and estimator.whitens:
        raise ConfigError(
            f"rollout.max_staleness={r.max_staleness} with algorithm.adv_estimator={a.adv_estimator} in the "
            "disaggregated placement: it whitens the advantages with a collective over every rank where the "
            "samples were scored, so the training ranks would wait for each future step's rollout; use grpo "
            "or rloo (group baselines, no collective), or rollout.max_staleness=0"
        )


def _check_rollout_correction(cfg: DistFlowConfig) -> None:
    """algorithm.rollout_correction: a cap that keeps something, a mask range that is a range."""
    rc = cfg.algorithm.rollout_correction
    where = "algorithm.rollout_correction"
    if rc.is_level != "none" and not rc.is_cap > 0:
        raise ConfigError(
            f"{where}.is_cap={rc.is_cap} must be > 0: it is the largest importance weight kept (2 is common)"
        )
    if rc.mask_level != "none" and not 0 <= rc.mask_low < rc.mask_high:
        raise ConfigError(
            f"{where}.mask_low={rc.mask_low} and mask_high={rc.mask_high} must satisfy 0 <= mask_low < "
            "mask_high: tokens whose ratio pi_prox / mu leaves [mask_low, mask_high] are masked (0.5 and 2 "
            "are common)"
        )


def _check_routing_replay(cfg: DistFlowConfig) -> None:
    """actor.moe_routing_replay: what the config alone can tell (a dense model.path, an engine that cannot
    return routes: distflow.preflight)."""
    a, r = cfg.actor, cfg.rollout
    if a.recompute_granularity == "full":
        raise ConfigError(
            "actor.moe_routing_replay=true with actor.recompute_granularity=full: the recomputed forward in "
            "the backward pass would route again, not replay; use recompute_granularity=selective or null"
        )
    if r.partial:
        raise ConfigError(
            "actor.moe_routing_replay=true with rollout.partial=true: a sample continued across a weight "
            "update is prefilled again by the new weights, so its routes are not those it was sampled with; "
            "drop one of them"
        )


def _check_partial(cfg: DistFlowConfig) -> None:
    """rollout.partial: where a weight sync can land while the engines generate (docs/async.md)."""
    r = cfg.rollout
    if r.max_staleness == 0:
        raise ConfigError(
            "rollout.partial=true needs rollout.max_staleness >= 1: in lock-step every rollout ends before the "
            "weight sync, so none is ever in flight across one"
        )
    if r.placement != "disaggregated":
        raise ConfigError(
            "rollout.partial=true needs rollout.placement=disaggregated: colocated engines share their devices "
            "with training, which cannot run while the engines still generate"
        )
    engines = r.num_ranks // max(r.engine_tp, 1)
    if r.balance == "steal" and engines > 1:
        raise ConfigError(
            f"rollout.partial=true with rollout.balance=steal and {engines} engines: engines steal chunks "
            "while they generate, which a rollout left in flight cannot do; set rollout.balance=partition"
        )
    mode = r.sglang.get("disaggregation_mode")
    if mode not in (None, "null"):
        raise ConfigError(
            f"rollout.partial=true with rollout.sglang.disaggregation_mode={mode!r}: a prefill/decode-split "
            "engine cannot interrupt and continue requests from their prefix; drop one of them"
        )


def _validate_role(role: str, rc, sizes: dict) -> None:
    """sizes: the role's parallel sizes, the actor's where the role leaves them unset."""
    for name in ("tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch_size", "max_tokens_per_micro_batch"):
        value = getattr(rc, name)
        if value is not None:  # unset: the actor's (checked as the actor's) or, for etp, the layout's tp
            _positive(f"{role}.{name}", value)
    if rc.sequence_parallel and sizes["tp"] == 1:
        raise ConfigError(f"{role}.sequence_parallel=true needs {role}.tp > 1 (got tp=1)")
    error = offload_error(role, rc)
    if error:
        raise ConfigError(error)


def offload_error(role: str, rc) -> str | None:
    """Why `{role}.offload` cannot be honoured (None: it can). Only the frozen reference model offloads its
    parameters (to CPU between forwards, on GPU); a training role's optimizer states go to CPU through
    Megatron's own optimizer offload instead."""
    if not rc.offload or role == "ref":
        return None
    return (
        f"{role}.offload=true is not supported: DistFlow offloads only the reference model's parameters "
        f"(ref.offload=true, on GPU). For {role}'s optimizer states use Megatron's optimizer CPU offload: "
        f"{role}.optim.megatron={{optimizer_cpu_offload: true, optimizer_offload_fraction: 1.0}} "
        "(GPU only; Megatron's HybridDeviceOptimizer); recompute_granularity=full saves activation memory"
    )


def _positive(key: str, value: int) -> None:
    if value < 1:
        raise ConfigError(f"{key}={value} must be >= 1")


def _validate_keys(where: str, given: dict, valid_fn, owned: dict, owner_prefix: str) -> None:
    # The library is imported only when there is something to check (importing SGLang takes seconds).
    valid = valid_fn() if given else None
    for key in given:
        if key in owned:
            raise ConfigError(
                f"{where}.{key} is set by DistFlow from {owner_prefix}{owned[key]}; set that instead"
            )
        if valid is not None and key not in valid:
            raise ConfigError(unknown_key_message(f"{where}.{key}", sorted(valid), f"{where}."))


@functools.cache
def megatron_fields() -> frozenset | None:
    """TransformerConfig field names (None when megatron-core is not installed: nothing to check against)."""
    try:
        with warnings.catch_warnings():  # megatron warns at import that TE/Apex are missing: expected on CPU
            warnings.simplefilter("ignore")
            from megatron.core.transformer.transformer_config import TransformerConfig
    except ImportError:
        return None
    return frozenset(f.name for f in dataclasses.fields(TransformerConfig))


@functools.cache
def megatron_optimizer_fields() -> frozenset | None:
    """Megatron-Core OptimizerConfig field names (None when megatron-core is not installed)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.optimizer import OptimizerConfig
    except ImportError:
        return None
    return frozenset(f.name for f in dataclasses.fields(OptimizerConfig))


@functools.cache
def sglang_fields() -> frozenset | None:
    """SGLang ServerArgs field names (None when sglang is not installed)."""
    # On CPU, SGLang must be imported under its CPU environment: it caches its platform check at first
    # use, and an engine started later in this process would otherwise take the GPU code paths.
    with contextlib.nullcontext() if cuda_available() else sglang_cpu_launch():
        try:
            from sglang.srt.server_args import ServerArgs
        except ImportError:
            return None
    if dataclasses.is_dataclass(ServerArgs):
        return frozenset(f.name for f in dataclasses.fields(ServerArgs))
    return frozenset(ServerArgs.__struct_fields__)  # a msgspec.Struct in 0.5.x
