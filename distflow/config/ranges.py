"""Range checks of single numeric fields (and a few pairs): each error names the dotted key, the value given
and the valid range, e.g. "actor.optim.lr=-0.001 must be > 0".

Called by distflow.config.validate.validate, so `python -m distflow.config show` and every entry point
reject a bad value before anything starts. The checks are written as `not (lo <= x)` so that NaN fails too.
"""

import math

from distflow.config.loader import ConfigError
from distflow.config.schema import DistFlowConfig


def check_ranges(cfg: DistFlowConfig) -> None:
    """Raises ConfigError on the first field outside its valid range."""
    for role in ("actor", "critic"):
        _check_optimizer(f"{role}.optim", getattr(cfg, role).optim)
        _check_updates(role, getattr(cfg, role), cfg.data.train_batch_size)
    for role in ("actor", "critic", "ref"):
        n = getattr(cfg, role).recompute_num_layers
        if n is not None:
            _at_least(f"{role}.recompute_num_layers", n, 1)
    _check_algorithm(cfg)
    _check_rollout(cfg)
    d = cfg.data
    _at_least("data.max_prompt_length", d.max_prompt_length, 1)
    _at_least("data.val_batch_size", d.val_batch_size, 1)
    if not d.prompt_key:
        raise ConfigError("data.prompt_key must name the column holding the chat messages (default 'prompt')")
    _greater("reward.timeout_s", cfg.reward.timeout_s, 0)
    _at_least("reward.num_workers", cfg.reward.num_workers, 0, "(0 scores in the calling process)")
    t = cfg.trainer
    _at_least("trainer.total_steps", t.total_steps, 1)
    _at_least("trainer.val_every", t.val_every, 0, "(0 disables validation)")
    _at_least("trainer.sft_warmup_steps", t.sft_warmup_steps, 0)
    _at_least("trainer.dist_timeout_s", t.dist_timeout_s, 1)
    _at_least("trainer.max_consecutive_bad_steps", t.max_consecutive_bad_steps, 1)
    for i, step in enumerate(t.profile_steps):
        if not 1 <= step <= t.total_steps:
            raise ConfigError(
                f"trainer.profile_steps[{i}]={step} must be a step in [1, trainer.total_steps="
                f"{t.total_steps}]"
            )
    _at_least("tracking.val_samples", cfg.tracking.val_samples, 0, "(0 logs no sample table)")
    _at_least("checkpoint.save_every", cfg.checkpoint.save_every, 0, "(0 saves only at the end)")
    _at_least("checkpoint.keep_last", cfg.checkpoint.keep_last, 1)


def _check_optimizer(where: str, o) -> None:
    _greater(f"{where}.lr", o.lr, 0)
    if not 0 <= o.min_lr <= o.lr:
        raise ConfigError(f"{where}.min_lr={o.min_lr} must be in [0, {where}.lr={o.lr}]")
    _at_least(f"{where}.lr_warmup_steps", o.lr_warmup_steps, 0)
    _at_least(f"{where}.weight_decay", o.weight_decay, 0)
    for name in ("adam_beta1", "adam_beta2"):
        value = getattr(o, name)
        if not 0 <= value < 1:
            raise ConfigError(f"{where}.{name}={value} must be in [0, 1)")
    _greater(f"{where}.adam_eps", o.adam_eps, 0)
    _at_least(f"{where}.clip_grad", o.clip_grad, 0, "(0 disables clipping)")


def _check_updates(role: str, rc, train_batch_size: int) -> None:
    _at_least(f"{role}.ppo_epochs", rc.ppo_epochs, 1)
    mini = rc.mini_batch_size
    _at_least(f"{role}.mini_batch_size", mini, 0, "(0 = data.train_batch_size)")
    if mini and (mini > train_batch_size or train_batch_size % mini):
        raise ConfigError(
            f"{role}.mini_batch_size={mini} must divide data.train_batch_size={train_batch_size} "
            f"(prompts per optimizer step; divisors: {_divisors(train_batch_size)}), or be 0 for one "
            "update per step"
        )


def _check_algorithm(cfg: DistFlowConfig) -> None:
    a = cfg.algorithm
    for name in ("gamma", "lam"):
        value = getattr(a, name)
        if not 0 <= value <= 1:
            raise ConfigError(f"algorithm.{name}={value} must be in [0, 1]")
    if not 0 < a.clip_ratio_low < 1:
        raise ConfigError(
            f"algorithm.clip_ratio_low={a.clip_ratio_low} must be in (0, 1): the ratio is clipped "
            "below at 1 - clip_ratio_low"
        )
    _greater("algorithm.clip_ratio_high", a.clip_ratio_high, 0)
    _greater("algorithm.clip_ratio_c", a.clip_ratio_c, 1, "(the dual-clip bound for negative advantages)")
    _at_least("algorithm.kl_coef", a.kl_coef, 0, "(0 disables the KL term)")
    # A negative entropy coefficient is allowed: it turns the bonus into entropy minimisation, a published
    # RL objective of its own; only a non-finite value is an error.
    if not math.isfinite(a.entropy_coef):
        raise ConfigError(f"algorithm.entropy_coef={a.entropy_coef} must be a finite number")
    _greater("algorithm.value_clip", a.value_clip, 0)
    _at_least("algorithm.max_sampling_attempts", a.max_sampling_attempts, 1)
    if not 0 <= a.overlong_buffer_len <= cfg.rollout.max_new_tokens:
        raise ConfigError(
            f"algorithm.overlong_buffer_len={a.overlong_buffer_len} must be between 0 (off) and "
            f"rollout.max_new_tokens={cfg.rollout.max_new_tokens}"
        )
    _at_least("algorithm.overlong_penalty_factor", a.overlong_penalty_factor, 0)


def _check_rollout(cfg: DistFlowConfig) -> None:
    r = cfg.rollout
    if not (r.top_k == -1 or r.top_k >= 1):
        raise ConfigError(f"rollout.top_k={r.top_k} must be -1 (off) or >= 1")
    if r.mem_fraction_static is not None and not 0 < r.mem_fraction_static < 1:
        raise ConfigError(
            f"rollout.mem_fraction_static={r.mem_fraction_static} must be in (0, 1), or null for "
            "SGLang's default"
        )
    for i, token in enumerate(r.stop_token_ids):
        _at_least(f"rollout.stop_token_ids[{i}]", token, 0)


def _at_least(key: str, value, low, note: str = "") -> None:
    if not value >= low:
        raise ConfigError(f"{key}={value} must be >= {low}" + (f" {note}" if note else ""))


def _greater(key: str, value, low, note: str = "") -> None:
    if not (value > low and math.isfinite(value)):
        raise ConfigError(f"{key}={value} must be > {low} (and finite)" + (f" {note}" if note else ""))


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0][:12]
