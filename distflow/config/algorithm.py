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

    The pass is redundant when the update is one optimizer step (one epoch, one mini-batch) and nothing reads
    the old log-probs before it (the outcome estimators): the update's own forward then runs the very weights
    the pass would, on the same samples, and its detached log-probs serve as the old ones (the ratio starts
    at 1, as it would). That holds for stale samples too (rollout.max_staleness > 0): the old log-probs are
    the current policy's, not the sampling policy's, which the engine's rollout log-probs are. Several
    mini-batches or epochs (the policy moves between them) and the token-level estimators need the pass."""
    actor = cfg.actor
    one_update = actor.ppo_epochs == 1 and actor.mini_batch_size in (0, cfg.data.train_batch_size)
    outcome = ESTIMATORS[cfg.algorithm.adv_estimator].kind == "outcome"
    return not (one_update and outcome)
