"""tracking.metric_names=verl: the names verl's trainer logs, for DistFlow's metrics that have a verl twin.

DistFlow logs its own names (docs/metrics.md); with metric_names=verl the Tracker renames, just before
writing, every metric found in VERL_ALIASES (exact names) or TIMING_ALIASES (timing_s/<node>), so that a
verl dashboard or script reads a DistFlow run. Names without a twin are written unchanged. This is the one
place the two schemes meet: add a pair here and to docs/metrics.md.
"""

METRIC_SCHEMES = ("distflow", "verl")

# DistFlow name -> verl name (verl/trainer/ppo/metric_utils.py: compute_data_metrics, compute_timing_metrics,
# compute_throughout_metrics; the actor's and critic's update metrics).
VERL_ALIASES = {
    # The scorer's reward per sample (verl: token_level_scores summed) and the reward trained on, after the
    # KL penalty or overlong shaping (verl: token_level_rewards summed).
    **{f"reward/{s}": f"critic/score/{s}" for s in ("mean", "max", "min")},
    **{f"reward/shaped/{s}": f"critic/rewards/{s}" for s in ("mean", "max", "min")},
    **{f"advantage/{s}": f"critic/advantages/{s}" for s in ("mean", "max", "min")},
    "critic/returns_mean": "critic/returns/mean",
    "critic/values_mean": "critic/values/mean",
    **{f"rollout/response_length/{s}": f"response_length/{s}" for s in ("mean", "max", "min", "clip_ratio")},
    **{f"rollout/prompt_length/{s}": f"prompt_length/{s}" for s in ("mean", "max", "min")},
    "rollout/tokens": "perf/total_num_tokens",
    "actor/kl": "actor/kl_loss",
}

# DAG node id -> verl's timing_s key (nodes of user pipelines keep their ids).
TIMING_ALIASES = {
    "generate": "gen",
    "reward": "reward",
    "old_logprob": "old_log_prob",
    "ref_logprob": "ref",
    "values": "values",
    "advantage": "adv",
    "train_actor": "update_actor",
    "train_critic": "update_critic",
    "sync_weights": "update_weights",
    "step": "step",
}


def alias(name: str, scheme: str) -> str:
    """The name metric `name` is written under in `scheme` ("distflow": unchanged)."""
    if scheme == "distflow":
        return name
    if scheme != "verl":
        raise ValueError(f"tracking.metric_names={scheme!r}; choose from {', '.join(METRIC_SCHEMES)}")
    if name.startswith("timing_s/"):
        node = name[len("timing_s/") :]
        return "timing_s/" + TIMING_ALIASES.get(node, node)
    return VERL_ALIASES.get(name, name)


def rename(metrics: dict, scheme: str) -> dict:
    """`metrics` under `scheme`'s names (a new dict; values untouched)."""
    return {alias(name, scheme): value for name, value in metrics.items()}
