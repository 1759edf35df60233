"""What algorithm.* implies: the advantage-estimator registry and whether a reference model runs.

One record per estimator states its facts; the config's allowed values (schema.AlgorithmConfig.adv_estimator),
the built-in pipelines' estimator tables and their advantage node (distflow.dag.builtin), and the dispatch of
the advantage computation (distflow.algorithms.estimators, which holds each record's function) are derived
from it. Torch-free and at the config layer: the layout, the config docs and the pre-flight read it.
A new estimator is one record here and its function in distflow.algorithms.estimators.ESTIMATOR_FUNCTIONS.
"""

from dataclasses import dataclass
from typing import Literal

EstimatorKind = Literal["outcome", "token_level", "gae"]


@dataclass(frozen=True)
class Estimator:
    name: str
    kind: EstimatorKind
    """outcome: one advantage per sample from its outcome reward, computed where the samples were scored with
    each prompt group whole; token_level: per-token advantages from token rewards, on the actor's layout (no
    critic); gae: per-token advantages and returns from the critic's values, on the actor's layout."""
    pipelines: tuple[str, ...]
    """The built-in pipelines (dag.pipeline) that run it."""
    kl_in_reward: bool = False
    """It reads per-token rewards, so it can take the KL to the reference as a reward penalty."""
    whitens: bool = False
    """It whitens its advantages over the whole batch (across ranks when the batch is spread over them)."""
    options: tuple[str, ...] = ()
    """AlgorithmConfig fields passed to its function by keyword."""

    @property
    def needs_critic(self) -> bool:
        return self.kind == "gae"


# The order is the config docs' order of the choices.
ESTIMATORS = {
    e.name: e
    for e in (
        Estimator("grpo", "outcome", pipelines=("grpo", "dapo"), options=("norm_adv_by_std",)),
        Estimator(
            "gae", "gae", pipelines=("ppo",), kl_in_reward=True, whitens=True, options=("gamma", "lam")
        ),
        Estimator("rloo", "outcome", pipelines=("grpo", "rloo", "dapo")),
        Estimator(
            "reinforce_pp",
            "token_level",
            pipelines=("grpo", "reinforce_pp"),
            kl_in_reward=True,
            whitens=True,
            options=("gamma",),
        ),
        Estimator(
            "reinforce_pp_baseline", "outcome", pipelines=("grpo", "reinforce_pp", "dapo"), whitens=True
        ),
    )
}
ESTIMATOR_NAMES = tuple(ESTIMATORS)
KL_IN_REWARD_ESTIMATORS = tuple(name for name, e in ESTIMATORS.items() if e.kl_in_reward)


def estimators_of(pipeline: str) -> tuple[str, ...]:
    """The estimators the built-in pipeline `pipeline` runs (empty for a name no record lists)."""
    return tuple(name for name, e in ESTIMATORS.items() if pipeline in e.pipelines)


def uses_reference(cfg) -> bool:
    """A reference model is built and its log-probs computed only when a KL term uses it."""
    return cfg.algorithm.kl_coef > 0 and cfg.ref.enable


def recomputes_old_logprobs(cfg) -> bool:
    """Whether each step runs the actor's separate old-log-prob forward before the update.

    The token-level estimators (reinforce_pp, gae) read the old log-probs before the update: they always
    need it. For the outcome estimators only the loss reads them, as the policy its ratio is taken against:
    - stale samples (rollout.max_staleness > 0): that is the sampling policy, whose log-probs the engine
      returned with the samples (nodes/train.py): no pass;
    - on-policy, one optimizer step per batch (one epoch, one mini-batch): the update's own forward runs the
      very weights the pass would, on the same samples; its detached log-probs serve (the ratio starts at 1,
      as it would): no pass;
    - on-policy, several mini-batches or epochs: the policy moves between them, the pass runs;
    - with a rollout correction (algorithm.rollout_correction), the ratio is taken against the proximal
      policy, the one before the update, stale samples or not: the pass runs for several updates, and one
      update's own forward serves otherwise."""
    if ESTIMATORS[cfg.algorithm.adv_estimator].kind != "outcome":
        return True
    actor = cfg.actor
    one_update = actor.ppo_epochs == 1 and actor.mini_batch_size in (0, cfg.data.train_batch_size)
    proximal = cfg.rollout.max_staleness == 0 or cfg.algorithm.rollout_correction.enabled
    return proximal and not one_update
