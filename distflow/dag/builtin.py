"""Built-in RL pipelines: GRPO, PPO, DAPO, RLOO, REINFORCE++ as DAGs over the node functions.

The node functions live in distflow.nodes (one module per kind of work); a pipeline only says who runs
what on which data. A user pipeline is any `module:function` returning a Pipeline (dag.pipeline=...).
"""
from distflow.config import ConfigError
from distflow.config.schema import DistFlowConfig
from distflow.dag.graph import Pipeline

N = "distflow.nodes"
# What moves between the rollout and training layouts. Every pipeline stage gets every field: the Megatron
# worker cuts micro-batches from whole rows on each rank of a replica (the last stage reads the tokens
# as labels, the first embeds them).
_SAMPLES = {"input_ids": "all", "response_mask": "all", "rollout_logprobs": "all"}
# Token-level advantages, values and returns are ragged like input_ids (one row per token).
FIELDS = {"samples": _SAMPLES, "kept_samples": _SAMPLES, "rewards": {"rewards": "all"},
          "kept_rewards": {"rewards": "all"}, "advantages": {"advantages": "all"}, "values": {"values": "all"},
          "returns": {"returns": "all"}}


def _head(p: Pipeline, cfg: DistFlowConfig) -> Pipeline:
    """generate -> reward, shared by every pipeline."""
    p.add("generate", "rollout", f"{N}.rollout:generate", ["prompts"], ["samples"],
          doc=f"each engine samples rollout.n={cfg.rollout.n} responses per prompt of its shard")
    if cfg.reward.model_path:
        if p.name == "dapo":
            raise ConfigError("reward.model_path with dag.pipeline=dapo: dynamic sampling filters groups where the "
                              "samples were generated, and model rewards are computed in the training layout; use "
                              "a rule-based or custom reward with dapo, or grpo/rloo/ppo with a reward model")
        # keep_groups: the advantage node runs where the model rewards are (see _outcome_inputs)
        p.add("reward", "reward_model", f"{N}.reward:model_score", ["samples"], ["rewards"], keep_groups=True,
              doc="reward model forward (Megatron, the actor's layout): the score of each whole sequence")
    else:
        p.add("reward", "reward", f"{N}.reward:score", ["samples"], ["rewards"],
              doc="rule-based or custom reward per sample, where the samples were generated")
    return p


def _outcome_inputs(cfg: DistFlowConfig, src: str, rewards: str) -> list[str]:
    """Inputs of an outcome-advantage node: a role-"all" node runs in the layout of its first input, which
    must be where the rewards are (model rewards are made in the training layout, rule rewards with the
    samples)."""
    return [rewards, src] if cfg.reward.model_path else [src, rewards]


def _uses_ref(cfg: DistFlowConfig) -> bool:
    return cfg.algorithm.kl_coef > 0 and cfg.ref.enable


def _logprobs(p: Pipeline, cfg: DistFlowConfig, src: str) -> None:
    p.add("old_logprob", "actor", f"{N}.logprob:actor_logprobs", [src], ["old_logprobs"],
          doc="the actor's log-probs before the update (Megatron forward, training layout)")
    if _uses_ref(cfg):
        kl_use = "reward penalty" if cfg.algorithm.kl_in_reward else "loss term"
        p.add("ref_logprob", "ref", f"{N}.logprob:ref_logprobs", [src], ["ref_logprobs"],
              doc=f"the frozen reference's log-probs, for the KL {kl_use} (kl_coef={cfg.algorithm.kl_coef})")


def _advantage(p: Pipeline, cfg: DistFlowConfig, src: str, rewards: str) -> None:
    """The advantage node for algorithm.adv_estimator: outcome estimators where the samples were scored
    (groups whole), REINFORCE++ token-level on the actor's layout (where the log-probs for its KL are)."""
    estimator = cfg.algorithm.adv_estimator
    if estimator == "reinforce_pp":
        inputs = ["old_logprobs", src, rewards] + (["ref_logprobs"] if _uses_ref(cfg) else [])
        p.add("advantage", "actor", f"{N}.advantage:token_level", inputs, ["advantages"],
              doc=f"REINFORCE++: discounted returns (gamma={cfg.algorithm.gamma})"
                  + (", KL penalty in the reward" if cfg.algorithm.kl_in_reward else "") + ", whitened over the batch")
    else:
        p.add("advantage", "all", f"{N}.advantage:compute", _outcome_inputs(cfg, src, rewards), ["advantages"],
              keep_groups=True,
              doc=f"outcome advantages per sample ({estimator})")


def _tail(p: Pipeline, cfg: DistFlowConfig, src: str) -> Pipeline:
    inputs = [src, "advantages", "old_logprobs"]
    if _uses_ref(cfg):
        inputs.append("ref_logprobs")
    p.add("train_actor", "actor", f"{N}.train:train_actor", inputs, ["actor_metrics"],
          doc="policy update: mini-batches, token-budget micro-batches, clipping")
    p.add("sync_weights", "all", f"{N}.sync:sync_weights", ["actor_metrics"], ["weight_version"],
          doc="the resharding coordinator pushes the new weights into the engines")
    return p


def grpo(cfg: DistFlowConfig, name: str = "grpo") -> Pipeline:
    p = _head(Pipeline(name, fields=FIELDS), cfg)
    _logprobs(p, cfg, "samples")
    _advantage(p, cfg, "samples", "rewards")
    return _tail(p, cfg, "samples")


def ppo(cfg: DistFlowConfig) -> Pipeline:
    p = _head(Pipeline("ppo", fields=FIELDS), cfg)
    _logprobs(p, cfg, "samples")
    p.add("values", "critic", f"{N}.critic:critic_values", ["samples"], ["values"],
          doc="critic forward: a value per response token")
    inputs = ["old_logprobs", "samples", "rewards", "values"] + (["ref_logprobs"] if _uses_ref(cfg) else [])
    a = cfg.algorithm
    p.add("advantage", "actor", f"{N}.advantage:gae", inputs, ["advantages", "returns"],
          doc=f"GAE (gamma={a.gamma}, lam={a.lam}) advantages, whitened over the batch, and the critic's returns"
              + ("; KL penalty in the reward" if a.kl_in_reward and _uses_ref(cfg) else ""))
    p.add("train_critic", "critic", f"{N}.critic:train_critic", ["samples", "values", "returns"], ["critic_metrics"],
          doc=f"value update, clipped to algorithm.value_clip={a.value_clip} around the old values")
    return _tail(p, cfg, "samples")


def dapo(cfg: DistFlowConfig) -> Pipeline:
    p = _head(Pipeline("dapo", fields=FIELDS), cfg)
    a = cfg.algorithm
    p.add("dynamic_sampling", "all", f"{N}.filters:dynamic_sampling", ["samples", "rewards"],
          ["kept_samples", "kept_rewards"], keep_groups=True,
          doc=f"overlong shaping (buffer {a.overlong_buffer_len} tokens); drop groups whose rewards are all "
              f"equal; generate again (up to {a.max_sampling_attempts} rounds, a collective decision) until "
              f"{cfg.data.train_batch_size} groups are kept")
    _logprobs(p, cfg, "kept_samples")
    p.add("advantage", "all", f"{N}.advantage:compute", ["kept_samples", "kept_rewards"], ["advantages"],
          keep_groups=True, doc="group-normalised advantages")
    return _read_as(_tail(p, cfg, "kept_samples"), {"kept_samples": "samples", "kept_rewards": "rewards"})


def _read_as(p: Pipeline, names: dict[str, str]) -> Pipeline:
    """Every node that consumes one of `names` receives it under the mapped key: the shared node functions
    read "samples"/"rewards", whatever the data is called in this graph."""
    import dataclasses

    for i, node in enumerate(p.nodes):
        renamed = {k: v for k, v in names.items() if k in node.inputs}
        if renamed:
            p.nodes[i] = dataclasses.replace(node, arg_names=tuple(sorted({**dict(node.arg_names), **renamed}.items())))
    return p


BUILTIN = {"grpo": grpo, "ppo": ppo, "dapo": dapo,
           "rloo": lambda cfg: grpo(cfg, "rloo"), "reinforce_pp": lambda cfg: grpo(cfg, "reinforce_pp")}
