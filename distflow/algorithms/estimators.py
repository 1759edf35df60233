"""The function of each advantage estimator, and `compute_advantages`, which dispatches on the config.

The estimators' facts (kind, pipelines, options) are records in distflow.config.algorithm, torch-free so that
the config and the layout can read them; this module adds what needs torch: the function each record runs.
Signatures by kind: outcome `fn(rewards [batch], group_ids, response_mask, **options) -> advantages`;
token_level `fn(token_rewards, response_mask, **options) -> (advantages, returns)`; gae
`fn(token_rewards, values, response_mask, **options) -> (advantages, returns)`. An estimator whose record says
`whitens` also takes `whiten=False` (the advantage node whitens over the batch of every rank itself).
"""

from typing import Callable, Optional

import torch

from distflow.algorithms.advantages import (
    _as_float,
    gae_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from distflow.algorithms.aggregation import masked_sum
from distflow.algorithms.groups import GroupIds
from distflow.config.algorithm import ESTIMATOR_NAMES, ESTIMATORS, Estimator

ESTIMATOR_FUNCTIONS: dict[str, Callable] = {
    "grpo": grpo_advantages,
    "gae": gae_advantages,
    "rloo": rloo_advantages,
    "reinforce_pp": reinforce_pp_advantages,
    "reinforce_pp_baseline": reinforce_pp_baseline_advantages,
}
# Checked at import: a record without a function (or the reverse) fails every entry point at once.
if set(ESTIMATOR_FUNCTIONS) != set(ESTIMATORS):
    raise ImportError(
        f"distflow.algorithms.estimators.ESTIMATOR_FUNCTIONS names {sorted(ESTIMATOR_FUNCTIONS)} but "
        f"distflow.config.algorithm.ESTIMATORS has {sorted(ESTIMATORS)}: give every record a function"
    )


def estimator_options(estimator: Estimator, config) -> dict:
    """The keyword arguments of `estimator`'s function, read from `config` (an AlgorithmConfig)."""
    return {name: getattr(config, name) for name in estimator.options}


def compute_advantages(
    config,
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: Optional[GroupIds] = None,
    values: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Advantages by `config.adv_estimator` (an `AlgorithmConfig` or anything with its fields), on local tensors
    (the DAG's advantage nodes, distflow.nodes.advantage, whiten across ranks instead).

    `token_rewards` [batch, seq] already hold the outcome reward on the last token and, with kl_in_reward,
    the KL penalty; outcome estimators (grpo, rloo, reinforce_pp_baseline) use their masked sum per
    sequence. `group_ids` is needed by the group estimators, `values` by gae. Returns (advantages, returns);
    returns is None for the estimators that have none (grpo, rloo, reinforce_pp_baseline).
    """
    name = config.adv_estimator
    estimator = ESTIMATORS.get(name)
    if estimator is None:
        raise ValueError(f"unknown adv_estimator {name!r}; valid: {', '.join(ESTIMATOR_NAMES)}")
    fn, options = ESTIMATOR_FUNCTIONS[name], estimator_options(estimator, config)
    if estimator.kind == "outcome":
        if group_ids is None:
            raise ValueError(f"adv_estimator={name} needs group_ids")
        rewards = masked_sum(_as_float(token_rewards), response_mask, dim=-1)
        return fn(rewards, group_ids, response_mask, **options), None
    if estimator.kind == "token_level":
        return fn(token_rewards, response_mask, **options)
    if values is None:
        raise ValueError(f"adv_estimator={name} needs the critic's values")
    return fn(token_rewards, values, response_mask, **options)
