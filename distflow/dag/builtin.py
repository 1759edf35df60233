"""Built-in RL pipelines: GRPO, RLOO, PPO, REINFORCE++ and DAPO, each one function listing its nodes.

A pipeline says who runs what on which data; the work of each node is a function of distflow.nodes. Each
function reads top to bottom in the order one step runs (generate, reward, [dynamic_sampling], [old_logprob],
[ref_logprob], [values], advantage, [train_critic], train_actor, sync_weights); a little repetition between
them is the price of reading one alone. Next to each is its `check_<name>(cfg)`: the settings it cannot run,
a ConfigError raised by distflow.dag.loading before the pipeline is built (the pre-flight, before any process
group). A user pipeline is any `module:function` returning a Pipeline (dag.pipeline=...).
"""

from distflow.config import ConfigError
from distflow.config.algorithm import ESTIMATORS, estimators_of, recomputes_old_logprobs, uses_reference
from distflow.config.schema import DistFlowConfig
from distflow.dag.graph import Pipeline
from distflow.nodes import advantage, critic, dynamic_sampling, logprob, reward, rollout, sync, train

# What moves between the rollout and training layouts. Every pipeline stage gets every field: the Megatron
# worker cuts micro-batches from whole rows on each rank of a replica (the last stage reads the tokens
# as labels, the first embeds them).
_SAMPLES = {"input_ids": "all", "response_mask": "all", "rollout_logprobs": "all"}
# Token-level advantages, values and returns are ragged like input_ids (one row per token).
FIELDS = {
    "samples": _SAMPLES,
    "kept_samples": _SAMPLES,
    "rewards": {"rewards": "all"},
    "kept_rewards": {"rewards": "all"},
    "advantages": {"advantages": "all"},
    "values": {"values": "all"},
    "returns": {"returns": "all"},
}


def fields_of(cfg: DistFlowConfig) -> dict:
    """FIELDS, and with actor.moe_routing_replay the engines' routes with the samples (every stage of the
    actor reads them: each replays its own layers')."""
    if not cfg.actor.moe_routing_replay:
        return FIELDS
    samples = {**_SAMPLES, "routed_experts": "all"}
    return {**FIELDS, "samples": samples, "kept_samples": samples}


# Node docs that several pipelines share, word for word.
GENERATE_DOC = "each engine samples rollout.n={n} responses per prompt of its shard"
SCORE_DOC = "rule-based or custom reward per sample, where the samples were generated"
MODEL_SCORE_DOC = "reward model forward (Megatron, the actor's layout): the score of each whole sequence"
OLD_LOGPROB_DOC = "the actor's log-probs before the update (Megatron forward, training layout)"
TRAIN_ACTOR_DOC = "policy update: mini-batches, token-budget micro-batches, clipping"
SYNC_DOC = "the resharding coordinator pushes the new weights into the engines"


def ref_logprob_doc(cfg: DistFlowConfig) -> str:
    kl_use = "reward penalty" if cfg.algorithm.kl_in_reward else "loss term"
    return f"the frozen reference's log-probs, for the KL {kl_use} (kl_coef={cfg.algorithm.kl_coef})"


def reinforce_pp_doc(cfg: DistFlowConfig) -> str:
    a = cfg.algorithm
    return (
        f"REINFORCE++: discounted returns (gamma={a.gamma})"
        + (", KL penalty in the reward" if a.kl_in_reward else "")
        + ", whitened over the batch"
    )


def grpo(cfg: DistFlowConfig) -> Pipeline:
    """GRPO (and any estimator of the grpo records: rloo, reinforce_pp, reinforce_pp_baseline)."""
    p, ref = Pipeline("grpo", fields=fields_of(cfg)), uses_reference(cfg)
    p.add(
        "generate",
        "rollout",
        rollout.generate,
        ["prompts"],
        ["samples"],
        doc=GENERATE_DOC.format(n=cfg.rollout.n),
    )
    if cfg.reward.model_path:  # keep_groups: the advantage node runs where the model rewards are
        p.add(
            "reward",
            "reward_model",
            reward.model_score,
            ["samples"],
            ["rewards"],
            keep_groups=True,
            doc=MODEL_SCORE_DOC,
        )
    else:
        p.add("reward", "reward", reward.score, ["samples"], ["rewards"], doc=SCORE_DOC)
    old = recomputes_old_logprobs(cfg)  # else the update's own forward gives them (nodes/train.py)
    if old:
        p.add(
            "old_logprob", "actor", logprob.actor_logprobs, ["samples"], ["old_logprobs"], doc=OLD_LOGPROB_DOC
        )
    if ref:
        p.add(
            "ref_logprob",
            "ref",
            logprob.ref_logprobs,
            ["samples"],
            ["ref_logprobs"],
            doc=ref_logprob_doc(cfg),
        )
    if (
        ESTIMATORS[cfg.algorithm.adv_estimator].kind == "token_level"
    ):  # on the actor's layout, by its log-probs
        p.add(
            "advantage",
            "actor",
            advantage.token_level,
            ["old_logprobs", "samples", "rewards"] + (["ref_logprobs"] if ref else []),
            ["advantages"],
            doc=reinforce_pp_doc(cfg),
        )
    else:  # a role-"all" node runs in the layout of its first input: where the rewards are
        p.add(
            "advantage",
            "all",
            advantage.compute,
            ["rewards", "samples"] if cfg.reward.model_path else ["samples", "rewards"],
            ["advantages"],
            keep_groups=True,
            doc=f"outcome advantages per sample ({cfg.algorithm.adv_estimator})",
        )
    p.add(
        "train_actor",
        "actor",
        train.train_actor,
        ["samples", "advantages"] + (["old_logprobs"] if old else []) + (["ref_logprobs"] if ref else []),
        ["actor_metrics"],
        doc=TRAIN_ACTOR_DOC,
    )
    p.add("sync_weights", "all", sync.sync_weights, ["actor_metrics"], ["weight_version"], doc=SYNC_DOC)
    return p


def check_grpo(cfg: DistFlowConfig) -> None:
    _check_estimator("grpo", cfg)
    _check_no_dapo_options("grpo", cfg)


def rloo(cfg: DistFlowConfig) -> Pipeline:
    """RLOO: GRPO's graph with the leave-one-out outcome advantage."""
    p, ref = Pipeline("rloo", fields=fields_of(cfg)), uses_reference(cfg)
    p.add(
        "generate",
        "rollout",
        rollout.generate,
        ["prompts"],
        ["samples"],
        doc=GENERATE_DOC.format(n=cfg.rollout.n),
    )
    if cfg.reward.model_path:  # keep_groups: the advantage node runs where the model rewards are
        p.add(
            "reward",
            "reward_model",
            reward.model_score,
            ["samples"],
            ["rewards"],
            keep_groups=True,
            doc=MODEL_SCORE_DOC,
        )
    else:
        p.add("reward", "reward", reward.score, ["samples"], ["rewards"], doc=SCORE_DOC)
    old = recomputes_old_logprobs(cfg)  # else the update's own forward gives them (nodes/train.py)
    if old:
        p.add(
            "old_logprob", "actor", logprob.actor_logprobs, ["samples"], ["old_logprobs"], doc=OLD_LOGPROB_DOC
        )
    if ref:
        p.add(
            "ref_logprob",
            "ref",
            logprob.ref_logprobs,
            ["samples"],
            ["ref_logprobs"],
            doc=ref_logprob_doc(cfg),
        )
    # a role-"all" node runs in the layout of its first input: where the rewards are
    p.add(
        "advantage",
        "all",
        advantage.compute,
        ["rewards", "samples"] if cfg.reward.model_path else ["samples", "rewards"],
        ["advantages"],
        keep_groups=True,
        doc=f"outcome advantages per sample ({cfg.algorithm.adv_estimator})",
    )
    p.add(
        "train_actor",
        "actor",
        train.train_actor,
        ["samples", "advantages"] + (["old_logprobs"] if old else []) + (["ref_logprobs"] if ref else []),
        ["actor_metrics"],
        doc=TRAIN_ACTOR_DOC,
    )
    p.add("sync_weights", "all", sync.sync_weights, ["actor_metrics"], ["weight_version"], doc=SYNC_DOC)
    return p


def check_rloo(cfg: DistFlowConfig) -> None:
    _check_estimator("rloo", cfg)
    _check_no_dapo_options("rloo", cfg)


def ppo(cfg: DistFlowConfig) -> Pipeline:
    """PPO: a critic's values, GAE advantages and returns, and a value update before the policy update."""
    p, ref, a = Pipeline("ppo", fields=fields_of(cfg)), uses_reference(cfg), cfg.algorithm
    p.add(
        "generate",
        "rollout",
        rollout.generate,
        ["prompts"],
        ["samples"],
        doc=GENERATE_DOC.format(n=cfg.rollout.n),
    )
    if cfg.reward.model_path:
        p.add(
            "reward",
            "reward_model",
            reward.model_score,
            ["samples"],
            ["rewards"],
            keep_groups=True,
            doc=MODEL_SCORE_DOC,
        )
    else:
        p.add("reward", "reward", reward.score, ["samples"], ["rewards"], doc=SCORE_DOC)
    p.add("old_logprob", "actor", logprob.actor_logprobs, ["samples"], ["old_logprobs"], doc=OLD_LOGPROB_DOC)
    if ref:
        p.add(
            "ref_logprob",
            "ref",
            logprob.ref_logprobs,
            ["samples"],
            ["ref_logprobs"],
            doc=ref_logprob_doc(cfg),
        )
    p.add(
        "values",
        "critic",
        critic.critic_values,
        ["samples"],
        ["values"],
        doc="critic forward: a value per response token",
    )
    p.add(
        "advantage",
        "actor",
        advantage.gae,
        ["old_logprobs", "samples", "rewards", "values"] + (["ref_logprobs"] if ref else []),
        ["advantages", "returns"],
        doc=f"GAE (gamma={a.gamma}, lam={a.lam}) advantages, whitened over the batch, and the critic's returns"
        + ("; KL penalty in the reward" if a.kl_in_reward and ref else ""),
    )
    p.add(
        "train_critic",
        "critic",
        critic.train_critic,
        ["samples", "values", "returns"],
        ["critic_metrics"],
        doc=f"value update, clipped to algorithm.value_clip={a.value_clip} around the old values",
    )
    p.add(
        "train_actor",
        "actor",
        train.train_actor,
        ["samples", "advantages", "old_logprobs"] + (["ref_logprobs"] if ref else []),
        ["actor_metrics"],
        doc=TRAIN_ACTOR_DOC,
    )
    p.add("sync_weights", "all", sync.sync_weights, ["actor_metrics"], ["weight_version"], doc=SYNC_DOC)
    return p


def check_ppo(cfg: DistFlowConfig) -> None:
    _check_estimator("ppo", cfg)
    _check_no_dapo_options("ppo", cfg)


def reinforce_pp(cfg: DistFlowConfig) -> Pipeline:
    """REINFORCE++ without a critic: token-level advantages on the actor's layout (reinforce_pp), or the
    group-baseline outcome advantage (reinforce_pp_baseline)."""
    p, ref = Pipeline("reinforce_pp", fields=fields_of(cfg)), uses_reference(cfg)
    p.add(
        "generate",
        "rollout",
        rollout.generate,
        ["prompts"],
        ["samples"],
        doc=GENERATE_DOC.format(n=cfg.rollout.n),
    )
    if cfg.reward.model_path:  # keep_groups: the advantage node runs where the model rewards are
        p.add(
            "reward",
            "reward_model",
            reward.model_score,
            ["samples"],
            ["rewards"],
            keep_groups=True,
            doc=MODEL_SCORE_DOC,
        )
    else:
        p.add("reward", "reward", reward.score, ["samples"], ["rewards"], doc=SCORE_DOC)
    old = recomputes_old_logprobs(cfg)  # else the update's own forward gives them (nodes/train.py)
    if old:
        p.add(
            "old_logprob", "actor", logprob.actor_logprobs, ["samples"], ["old_logprobs"], doc=OLD_LOGPROB_DOC
        )
    if ref:
        p.add(
            "ref_logprob",
            "ref",
            logprob.ref_logprobs,
            ["samples"],
            ["ref_logprobs"],
            doc=ref_logprob_doc(cfg),
        )
    if (
        ESTIMATORS[cfg.algorithm.adv_estimator].kind == "token_level"
    ):  # on the actor's layout, by its log-probs
        p.add(
            "advantage",
            "actor",
            advantage.token_level,
            ["old_logprobs", "samples", "rewards"] + (["ref_logprobs"] if ref else []),
            ["advantages"],
            doc=reinforce_pp_doc(cfg),
        )
    else:  # a role-"all" node runs in the layout of its first input: where the rewards are
        p.add(
            "advantage",
            "all",
            advantage.compute,
            ["rewards", "samples"] if cfg.reward.model_path else ["samples", "rewards"],
            ["advantages"],
            keep_groups=True,
            doc=f"outcome advantages per sample ({cfg.algorithm.adv_estimator})",
        )
    p.add(
        "train_actor",
        "actor",
        train.train_actor,
        ["samples", "advantages"] + (["old_logprobs"] if old else []) + (["ref_logprobs"] if ref else []),
        ["actor_metrics"],
        doc=TRAIN_ACTOR_DOC,
    )
    p.add("sync_weights", "all", sync.sync_weights, ["actor_metrics"], ["weight_version"], doc=SYNC_DOC)
    return p


def check_reinforce_pp(cfg: DistFlowConfig) -> None:
    _check_estimator("reinforce_pp", cfg)
    _check_no_dapo_options("reinforce_pp", cfg)


def dapo(cfg: DistFlowConfig) -> Pipeline:
    """DAPO: GRPO behind a dynamic-sampling filter. The nodes after it read kept_samples/kept_rewards under the
    names the shared node functions take ("samples", "rewards")."""
    p, ref, a = Pipeline("dapo", fields=fields_of(cfg)), uses_reference(cfg), cfg.algorithm
    kept = {"kept_samples": "samples"}
    p.add(
        "generate",
        "rollout",
        rollout.generate,
        ["prompts"],
        ["samples"],
        doc=GENERATE_DOC.format(n=cfg.rollout.n),
    )
    p.add("reward", "reward", reward.score, ["samples"], ["rewards"], doc=SCORE_DOC)
    p.add(
        "dynamic_sampling",
        "all",
        dynamic_sampling.dynamic_sampling,
        ["samples", "rewards"],
        ["kept_samples", "kept_rewards"],
        keep_groups=True,
        doc=f"overlong shaping (buffer {a.overlong_buffer_len} tokens); drop groups whose rewards are all "
        f"equal; generate again (up to {a.max_sampling_attempts} rounds, a collective decision) until "
        f"{cfg.data.train_batch_size} groups are kept",
    )
    old = recomputes_old_logprobs(cfg)  # else the update's own forward gives them (nodes/train.py)
    if old:
        p.add(
            "old_logprob",
            "actor",
            logprob.actor_logprobs,
            ["kept_samples"],
            ["old_logprobs"],
            doc=OLD_LOGPROB_DOC,
            arg_names=kept,
        )
    if ref:
        p.add(
            "ref_logprob",
            "ref",
            logprob.ref_logprobs,
            ["kept_samples"],
            ["ref_logprobs"],
            doc=ref_logprob_doc(cfg),
            arg_names=kept,
        )
    p.add(
        "advantage",
        "all",
        advantage.compute,
        ["kept_samples", "kept_rewards"],
        ["advantages"],
        keep_groups=True,
        doc="group-normalised advantages",
        arg_names={**kept, "kept_rewards": "rewards"},
    )
    p.add(
        "train_actor",
        "actor",
        train.train_actor,
        ["kept_samples", "advantages"]
        + (["old_logprobs"] if old else [])
        + (["ref_logprobs"] if ref else []),
        ["actor_metrics"],
        doc=TRAIN_ACTOR_DOC,
        arg_names=kept,
    )
    p.add("sync_weights", "all", sync.sync_weights, ["actor_metrics"], ["weight_version"], doc=SYNC_DOC)
    return p


def check_dapo(cfg: DistFlowConfig) -> None:
    _check_estimator("dapo", cfg)
    if cfg.reward.model_path:
        raise ConfigError(
            "reward.model_path with dag.pipeline=dapo: dynamic sampling filters groups where the "
            "samples were generated, and model rewards are computed in the training layout; use "
            "a rule-based or custom reward with dapo, or grpo/rloo/ppo with a reward model"
        )


BUILTIN = {"grpo": grpo, "rloo": rloo, "ppo": ppo, "reinforce_pp": reinforce_pp, "dapo": dapo}
"""dag.pipeline name -> the function that builds that pipeline for a config."""
CHECKS = {
    "grpo": check_grpo,
    "rloo": check_rloo,
    "ppo": check_ppo,
    "reinforce_pp": check_reinforce_pp,
    "dapo": check_dapo,
}
"""dag.pipeline name -> its compatibility check (ConfigError), run before the pipeline is built."""


def _check_estimator(name: str, cfg: DistFlowConfig) -> None:
    """algorithm.adv_estimator is one the records of distflow.config.algorithm list for pipeline `name`."""
    valid, estimator = estimators_of(name), cfg.algorithm.adv_estimator
    if estimator not in valid:
        raise ConfigError(
            f"dag.pipeline={name} runs algorithm.adv_estimator in {list(valid)}, got {estimator!r}"
            + ("; GAE needs the critic of dag.pipeline=ppo" if ESTIMATORS[estimator].needs_critic else "")
        )


def _check_no_dapo_options(name: str, cfg: DistFlowConfig) -> None:
    """DAPO's options need its dynamic-sampling node (user pipelines may use that node themselves)."""
    a = cfg.algorithm
    if a.dynamic_sampling:
        raise ConfigError(
            f"algorithm.dynamic_sampling=true needs dag.pipeline=dapo (got {name}): only the DAPO "
            "pipeline has the dynamic-sampling node"
        )
    if a.overlong_buffer_len:
        raise ConfigError(
            f"algorithm.overlong_buffer_len={a.overlong_buffer_len} (overlong reward shaping) "
            f"needs dag.pipeline=dapo (got {name}); set it to 0 or use dapo"
        )
