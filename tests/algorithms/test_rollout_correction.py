"""Rollout correction against hand-computed values: truncated importance weights (token and sequence),
masks (token and sequence), the mismatch metrics, and the corrected PPO loss (decoupled: clipped against
the proximal policy, weighed against the behaviour policy), which is plain PPO when engine and trainer agree."""

import dataclasses
import math

import pytest
import torch

from distflow.algorithms import policy_loss, ppo_clip_loss
from distflow.algorithms.rollout_correction import correction_weights, mismatch_metrics
from distflow.config import ConfigError, resolve
from distflow.config.schema import AlgorithmConfig, RolloutCorrectionConfig

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
# pi_prox / mu per token: [2, 0.5, 3] and [1.5, 0.25, (padding)]
RATIOS = torch.tensor([[2.0, 0.5, 3.0], [1.5, 0.25, 7.0]])
BEHAVIOUR = torch.tensor([[-1.0, -2.0, -0.5], [-1.2, -0.3, -0.9]])
PROXIMAL = BEHAVIOUR + RATIOS.log()


def weights(**kw):
    w, metrics = correction_weights(PROXIMAL, BEHAVIOUR, MASK, **kw)
    return w, {k: float(v) for k, v in metrics.items()}


def test_token_level_truncated_importance_weights():
    w, m = weights(is_level="token", is_cap=2.0)
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 2.0], [1.5, 0.25, 0.0]]))
    assert m["is_weight_mean"] == pytest.approx((2 + 0.5 + 2 + 1.5 + 0.25) / 5)
    assert m["is_weight_max"] == pytest.approx(2.0) and m["masked_fraction"] == 0.0


def test_sequence_level_weights_are_the_capped_product():
    w, m = weights(is_level="sequence", is_cap=2.0)  # products 2 * 0.5 * 3 = 3 -> 2, and 1.5 * 0.25 = 0.375
    assert torch.allclose(w, torch.tensor([[2.0, 2.0, 2.0], [0.375, 0.375, 0.0]]))
    assert m["is_weight_mean"] == pytest.approx((3 * 2 + 2 * 0.375) / 5)


def test_token_mask_drops_tokens_outside_the_range():
    w, m = weights(mask_level="token", mask_low=0.5, mask_high=2.0)
    assert torch.allclose(w, torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))  # 3 and 0.25 fall out
    assert m["masked_fraction"] == pytest.approx(2 / 5) and m["is_weight_mean"] == 1.0


def test_sequence_mask_tests_the_geometric_mean():
    # geometric means: 3 ** (1/3) = 1.442 and 0.375 ** (1/2) = 0.612
    w, m = weights(mask_level="sequence", mask_low=0.5, mask_high=2.0)
    assert torch.equal(w, MASK) and m["masked_fraction"] == 0.0
    w, m = weights(mask_level="sequence", mask_low=0.7, mask_high=2.0)
    assert torch.equal(w, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert m["masked_fraction"] == pytest.approx(2 / 5)


def test_truncation_and_mask_together():
    w, _ = weights(is_level="token", is_cap=2.0, mask_level="token", mask_low=0.5, mask_high=2.0)
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 0.0], [1.5, 0.0, 0.0]]))


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"is_level": "token", "is_cap": 0.0}, "is_cap=0.0 must be > 0"),
        ({"mask_level": "token", "mask_low": 2.0, "mask_high": 2.0}, "0 <= low < high"),
        ({"is_level": "tokens"}, "level 'tokens'; valid: none, token, sequence"),
    ],
)
def test_bad_settings_are_named(kw, message):
    with pytest.raises(ValueError, match=message):
        weights(**kw)


def test_mismatch_metrics():
    trainer = torch.tensor([[-1.0, -2.0]])
    behaviour = trainer - torch.tensor([[0.1, -0.2]])  # trainer - engine = 0.1, -0.2
    m = {k: float(v) for k, v in mismatch_metrics(trainer, behaviour, torch.ones(1, 2)).items()}
    assert m["logprob_abs_diff"] == pytest.approx(0.15) and m["logprob_abs_diff_max"] == pytest.approx(0.2)
    k3 = ((math.exp(0.1) - 1 - 0.1) + (math.exp(-0.2) - 1 + 0.2)) / 2
    assert m["kl"] == pytest.approx(k3, rel=1e-5)
    assert m["ppl_ratio"] == pytest.approx(math.exp(0.05), rel=1e-6)  # exp(-mean(trainer - engine))
    same = mismatch_metrics(trainer, trainer, torch.ones(1, 2))
    assert float(same["kl"]) == 0.0 and float(same["ppl_ratio"]) == 1.0


def test_weighted_ppo_loss_by_hand():
    """At ratio 1 (the update's first forward) each token's loss is -A: weighed, the token mean is
    sum(-A w) / tokens, the denominator unchanged."""
    advantages = torch.tensor([[1.0, -1.0, 2.0], [0.5, 0.5, 0.5]])
    w = torch.tensor([[2.0, 0.5, 0.0], [1.5, 0.0, 0.0]])
    loss, _ = ppo_clip_loss(PROXIMAL, PROXIMAL, advantages, MASK, token_weights=w)
    expected = (-(1.0 * 2.0) - (-1.0 * 0.5) - 0.0 - (0.5 * 1.5) - 0.0) / 5
    assert float(loss) == pytest.approx(expected)


def _config(**correction):
    return AlgorithmConfig(rollout_correction=RolloutCorrectionConfig(**correction))


def test_corrected_loss_is_plain_ppo_when_engine_and_trainer_agree():
    torch.manual_seed(0)
    logprob = (PROXIMAL + 0.3 * torch.randn(2, 3)).requires_grad_()
    advantages = torch.randn(2, 3)
    plain, _ = policy_loss(logprob, PROXIMAL, advantages, MASK, AlgorithmConfig())
    (plain_grad,) = torch.autograd.grad(plain, logprob)
    for correction in (
        {"is_level": "token"},
        {"is_level": "sequence"},
        {"mask_level": "token"},
        {"is_level": "token", "mask_level": "sequence"},
    ):
        loss, metrics = policy_loss(
            logprob, PROXIMAL, advantages, MASK, _config(**correction), rollout_logprob=PROXIMAL
        )
        (grad,) = torch.autograd.grad(loss, logprob)
        assert float(loss.detach()) == pytest.approx(float(plain.detach())) and torch.allclose(
            grad, plain_grad
        )
        assert float(metrics["rollout_corr/is_weight_mean"]) == 1.0
        assert float(metrics["rollout_corr/masked_fraction"]) == 0.0


def test_decoupled_ppo_clips_against_the_proximal_and_weighs_against_the_behaviour_policy():
    """The gradient is w * grad(PPO clipped at pi / pi_prox): a token the engine under-sampled (w > 1) counts
    more; one clipped against the proximal policy gives none, whatever its weight."""
    logprob = PROXIMAL.clone().requires_grad_()
    advantages = torch.ones(2, 3)
    loss, _ = policy_loss(
        logprob, PROXIMAL, advantages, MASK, _config(is_level="token", is_cap=2.0), rollout_logprob=BEHAVIOUR
    )
    (grad,) = torch.autograd.grad(loss, logprob)
    # d/dlogprob of -A r w / tokens at r = 1 is -w / 5 per token
    assert torch.allclose(grad, -torch.tensor([[2.0, 0.5, 2.0], [1.5, 0.25, 0.0]]) / 5)
    beyond = (PROXIMAL + math.log(1.5)).requires_grad_()  # r = 1.5 > 1 + 0.2 with A > 0: clipped
    loss, _ = policy_loss(
        beyond, PROXIMAL, advantages, MASK, _config(is_level="token"), rollout_logprob=BEHAVIOUR
    )
    (grad,) = torch.autograd.grad(loss, beyond)
    assert torch.count_nonzero(grad) == 0


def test_a_correction_needs_the_engine_logprobs():
    with pytest.raises(ValueError, match="needs the engine's `rollout_logprob`"):
        policy_loss(PROXIMAL, PROXIMAL, torch.ones(2, 3), MASK, _config(is_level="token"))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["algorithm.rollout_correction.is_level=token", "algorithm.rollout_correction.is_cap=0"],
            "is_cap=0.0",
        ),
        (
            ["algorithm.rollout_correction.mask_level=token", "algorithm.rollout_correction.mask_low=3"],
            "mask_low=3.0 and mask_high=2.0",
        ),
    ],
)
def test_config_refuses_by_field(overrides, message):
    with pytest.raises(ConfigError, match=f"algorithm.rollout_correction.{message}"):
        resolve(None, overrides)


def test_config_section_round_trips():
    cfg = resolve(None, ["algorithm.rollout_correction.is_level=sequence"])
    assert (
        cfg.algorithm.rollout_correction.enabled
        and not dataclasses.replace(cfg.algorithm.rollout_correction, is_level="none").enabled
    )
