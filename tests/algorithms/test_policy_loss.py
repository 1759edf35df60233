"""Actor losses (PPO clip, dual-clip, GSPO, the config entry) and the critic loss, against hand-computed values."""

import dataclasses
import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from distflow.algorithms import gspo_loss, policy_loss, ppo_clip_loss, value_loss
from distflow.config.schema import AlgorithmConfig

# PPO case, clip range [1 - 0.2, 1 + 0.28] (clip-higher), dual-clip c = 3; the last token is padding.
#   token  A   ratio  -A r   -A clip(r)   max     dual cap -A c  loss   clipped  dual
#   0     +1   1.1   -1.1   -1.1         -1.1                    -1.1
#   1     +1   1.5   -1.5   -1.28        -1.28                   -1.28  yes
#   2     -1   0.5    0.5    0.8          0.8     3               0.8   yes
#   3     -1   4.0    4.0    1.28         4.0     3               3.0            yes
#   4     +2   0.5   -1.0   -1.6         -1.0                    -1.0
# token-mean = (-1.1 - 1.28 + 0.8 + 3 - 1) / 5 = 0.42 / 5 = 0.084
PPO_RATIO = torch.tensor([[1.1, 1.5, 0.5, 4.0, 0.5, math.exp(100.0)]], dtype=torch.float64)
PPO_ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0, 2.0, 5.0]], dtype=torch.float64)
PPO_MASK = torch.tensor([[1, 1, 1, 1, 1, 0]])
OLD = torch.zeros(1, 6, dtype=torch.float64)


def ppo(**kwargs):
    args = dict(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    return ppo_clip_loss(PPO_RATIO.log(), OLD, PPO_ADV, PPO_MASK, **{**args, **kwargs})


def test_ppo_loss_and_metrics_by_hand():
    loss, metrics = ppo()
    assert loss.item() == pytest.approx(0.084)
    assert metrics["pg_clipfrac"].item() == pytest.approx(2 / 5)  # tokens 1 and 2
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(1 / 5)  # token 3
    # -mean(log r) = -ln(1.1 * 1.5 * 0.5 * 4 * 0.5) / 5 = -ln(1.65) / 5
    assert metrics["ppo_kl"].item() == pytest.approx(-math.log(1.65) / 5)
    assert metrics["ratio_mean"].item() == pytest.approx(7.6 / 5)


def test_ppo_without_dual_clip():
    loss, metrics = ppo(clip_ratio_c=None)  # token 3 keeps 4.0: (0.42 - 3 + 4) / 5
    assert loss.item() == pytest.approx(1.42 / 5)
    assert metrics["pg_clipfrac_lower"].item() == 0.0


def test_ppo_rejects_dual_clip_at_or_below_one():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ppo(clip_ratio_c=1.0)


@settings(max_examples=60, deadline=None)
@given(
    # (log ratio, advantage): advantages are drawn away from 0 (where the gradient's sign is undefined),
    # not filtered, so that Hypothesis does not discard most lists of 10 for one zero among them.
    tokens=st.lists(
        st.tuples(st.floats(-2.0, 2.0), st.floats(1e-3, 3.0) | st.floats(-3.0, -1e-3)),
        min_size=1,
        max_size=10,
    ),
    low=st.floats(0.05, 0.3),
    high=st.floats(0.05, 0.4),
)
def test_ppo_gradient_is_minus_advantage_times_ratio_gradient_or_zero(tokens, low, high):
    log_ratio, advantages = torch.tensor(tokens, dtype=torch.float64).unbind(-1)
    ratio = log_ratio.exp()
    c = 3.0
    assume(all(abs(ratio - bound).min() > 1e-6 for bound in (1 - low, 1 + high, c)))
    logprob = log_ratio.clone().requires_grad_(True)
    loss, _ = ppo_clip_loss(
        logprob[None],
        torch.zeros(1, len(tokens), dtype=torch.float64),
        advantages[None],
        torch.ones(1, len(tokens)),
        low,
        high,
        c,
        "token-mean",
    )
    loss.backward()
    clipped = ((advantages > 0) & (ratio > 1 + high)) | ((advantages < 0) & (ratio < 1 - low))
    dual_clipped = (advantages < 0) & (ratio > c)
    # d(-A r)/d logprob = -A r; token-mean divides by the number of tokens.
    expected = torch.where(clipped | dual_clipped, 0.0, -advantages * ratio) / len(tokens)
    torch.testing.assert_close(logprob.grad, expected)


# GSPO case, clip range [0.8, 1.2] to make clipping visible.
#   seq 0 (2 tokens): log r = [0.1, 0.3], mean 0.2,    s = e^0.2   = 1.2214028, A = +1
#                     -A s = -1.2214 < -A clip(s) = -1.2 -> loss -1.2 on each token (clipped)
#   seq 1 (3 tokens): log r = [-0.2, 0, 0.05], mean -0.05, s = e^-0.05 = 0.9512294, A = -1 -> loss 0.9512294
# seq-mean-token-mean = (-1.2 + 0.9512294) / 2
GSPO_LOG_RATIO = torch.tensor([[0.1, 0.3, 9.0], [-0.2, 0.0, 0.05]], dtype=torch.float64)
GSPO_ADV = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]], dtype=torch.float64)
GSPO_MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])


def test_gspo_loss_metrics_and_gradient_by_hand():
    logprob = GSPO_LOG_RATIO.clone().requires_grad_(True)
    loss, metrics = gspo_loss(logprob, torch.zeros(2, 3, dtype=torch.float64), GSPO_ADV, GSPO_MASK, 0.2, 0.2)
    assert loss.item() == pytest.approx((-1.2 + math.exp(-0.05)) / 2)
    assert metrics["pg_clipfrac"].item() == pytest.approx(2 / 5)
    assert metrics["ppo_kl"].item() == pytest.approx(-0.25 / 5)  # -(0.1 + 0.3 - 0.2 + 0 + 0.05) / 5
    assert metrics["ratio_mean"].item() == pytest.approx((2 * math.exp(0.2) + 3 * math.exp(-0.05)) / 5)
    loss.backward()
    # seq 0 clipped: no gradient; seq 1: every token gets -A s / (|y| * batch) = e^-0.05 / 6
    expected = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64) * math.exp(-0.05) / 6
    torch.testing.assert_close(logprob.grad, expected)


def test_gspo_gradient_equals_the_sequence_level_objective():
    # Where nothing is clipped, the token-level form differentiates like the paper's -A_i s_i(theta),
    # s_i = exp(mean_t log r_t), averaged over sequences.
    log_ratio = torch.tensor([[1e-4, -2e-4, 5.0], [5e-5, 1e-4, -1e-4]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    advantages = torch.tensor([0.7, -1.3], dtype=torch.float64)
    token_form = log_ratio.clone().requires_grad_(True)
    loss, metrics = gspo_loss(token_form, torch.zeros_like(log_ratio), advantages[:, None].expand(2, 3), mask)
    assert metrics["pg_clipfrac"].item() == 0.0
    loss.backward()
    sequence_form = log_ratio.clone().requires_grad_(True)
    mean_log_ratio = (sequence_form * mask).sum(-1) / mask.sum(-1)
    (-advantages * mean_log_ratio.exp()).mean().backward()
    torch.testing.assert_close(token_form.grad, sequence_form.grad)


def config(**fields):
    return dataclasses.replace(AlgorithmConfig(), **fields)


def entry_inputs():
    logprob = torch.tensor([[-1.0, -2.0]])
    return dict(
        logprob=logprob,
        old_logprob=logprob.clone(),
        advantages=torch.tensor([[1.0, 3.0]]),
        response_mask=torch.ones(1, 2),
        entropy=torch.tensor([[0.5, 1.5]]),
        ref_logprob=logprob - torch.tensor([[0.2, 0.4]]),
    )


def test_policy_loss_entry_combines_the_terms():
    # ratio 1 -> pg = -(1 + 3) / 2 = -2; entropy mean 1.0; k1 = logprob - ref = [0.2, 0.4], mean 0.3
    cfg = config(entropy_coef=0.01, kl_coef=0.1, kl_estimator="k1")
    loss, metrics = policy_loss(config=cfg, **entry_inputs())
    assert loss.item() == pytest.approx(-2 - 0.01 * 1.0 + 0.1 * 0.3)
    assert {"pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "ratio_mean", "entropy", "kl"} <= set(
        metrics
    )
    assert metrics["pg_loss"].item() == pytest.approx(-2.0)
    assert metrics["kl"].item() == pytest.approx(0.3)

    loss, metrics = policy_loss(config=dataclasses.replace(cfg, kl_in_reward=True), **entry_inputs())
    assert loss.item() == pytest.approx(-2 - 0.01 * 1.0)  # KL lives in the rewards, still reported
    assert metrics["kl"].item() == pytest.approx(0.3)


def test_policy_loss_entry_dispatches_gspo():
    inputs = entry_inputs()
    inputs["logprob"] = inputs["logprob"] + torch.tensor([[0.1, -0.3]])
    cfg = config(
        policy_loss="gspo", clip_ratio_low=3e-4, clip_ratio_high=4e-4, loss_agg_mode="seq-mean-token-mean"
    )
    loss, _ = policy_loss(config=cfg, **inputs)
    expected, _ = gspo_loss(
        inputs["logprob"],
        inputs["old_logprob"],
        inputs["advantages"],
        inputs["response_mask"],
        3e-4,
        4e-4,
        "seq-mean-token-mean",
    )
    assert loss.item() == expected.item()


def test_policy_loss_entry_requires_its_inputs():
    inputs = entry_inputs()
    with pytest.raises(ValueError, match="entropy"):
        policy_loss(config=config(entropy_coef=0.01), **{**inputs, "entropy": None})
    with pytest.raises(ValueError, match="ref_logprob"):
        policy_loss(config=config(kl_coef=0.1), **{**inputs, "ref_logprob": None})


# Value loss, clip 0.5; the last token is padding.
#   token  old   v     R    (v - R)^2   v_clip   (v_clip - R)^2   max    clipped
#   0      1.0   1.2   2.0  0.64        1.2      0.64             0.64
#   1      1.0   2.0   2.0  0.0         1.5      0.25             0.25   yes
#   2      0.0  -1.0   1.0  4.0        -0.5      2.25             4.0
# loss = 0.5 * (0.64 + 0.25 + 4) / 3 = 0.815
VALUES = torch.tensor([[1.2, 2.0, -1.0, 50.0]], dtype=torch.float64)
OLD_VALUES = torch.tensor([[1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
RETURNS = torch.tensor([[2.0, 2.0, 1.0, 0.0]], dtype=torch.float64)
VALUE_MASK = torch.tensor([[1, 1, 1, 0]])


def test_value_loss_by_hand():
    values = VALUES.clone().requires_grad_(True)
    loss, metrics = value_loss(values, OLD_VALUES, RETURNS, VALUE_MASK, clip_range=0.5)
    assert loss.item() == pytest.approx(0.815)
    assert metrics["vf_clipfrac"].item() == pytest.approx(1 / 3)
    loss.backward()
    # d/dv of 0.5 (v - R)^2 / 3 = (v - R) / 3 where unclipped; 0 where clipped and on padding.
    expected = torch.tensor([[(1.2 - 2.0) / 3, 0.0, (-1.0 - 1.0) / 3, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(values.grad, expected)


def test_value_loss_without_clipping():
    loss, metrics = value_loss(VALUES, OLD_VALUES, RETURNS, VALUE_MASK, clip_range=None)
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.0 + 4.0) / 3)
    assert metrics["vf_clipfrac"].item() == 0.0


def test_gspo_token_gradient_follows_its_own_advantage():
    # GSPO-token: grad_t = -A_t * s_i / (|y_i| * batch), so per-token advantages stay per token (the
    # stop-gradient is what keeps them from being averaged over the sequence).
    # One sequence, log r = [0.01, -0.01, 0.03], mean 0.01, s = e^0.01; A = [1, -2, 0.5]
    log_ratio = torch.tensor([[0.01, -0.01, 0.03]], dtype=torch.float64)
    advantages = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.float64)
    logprob = log_ratio.clone().requires_grad_(True)
    loss, _ = gspo_loss(logprob, torch.zeros_like(log_ratio), advantages, torch.ones(1, 3), 0.2, 0.2)
    loss.backward()
    torch.testing.assert_close(logprob.grad, -advantages * math.exp(0.01) / 3)
