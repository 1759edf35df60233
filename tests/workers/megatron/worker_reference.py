"""What the worker tests and their torchrun job share: the losses, a variable-length batch, and the Hugging
Face side (transformers' log-probs, entropy and gradients on the same weights: the numbers to match)."""

import torch

from distflow.algorithms.aggregation import masked_mean
from distflow.algorithms.entropy import entropy_from_logits
from distflow.algorithms.policy_loss import ppo_clip_loss

ENTROPY_COEF = 0.01

ROWS = 8
PROMPT_LENGTHS = [3, 9, 5, 4, 8, 6, 3, 7]
RESPONSE_LENGTHS = [12, 2, 7, 10, 5, 9, 4, 1]
PAD_ID = 0


def pg_loss(logprobs, entropy, mb):
    """PPO clipped surrogate (token-mean) minus an entropy bonus: a policy-gradient-style loss that uses
    both outputs of the worker."""
    loss, metrics = ppo_clip_loss(logprobs, mb["old_logprobs"], mb["advantages"], mb["response_mask"])
    entropy_mean = masked_mean(entropy, mb["response_mask"])
    return loss - ENTROPY_COEF * entropy_mean, {**metrics, "entropy": entropy_mean.detach()}


def mse_loss(values, mb):
    loss = 0.5 * masked_mean((values - mb["returns"]).square(), mb["response_mask"])
    return loss, {"vf_loss": loss.detach()}


def make_batch(vocab: int, seed: int = 0) -> dict:
    """Right-padded rows of random prompt + response tokens (ids over the whole vocabulary, so that the last
    TP rank's vocabulary slice and its padding are exercised); no per-token fields that need a model yet."""
    gen = torch.Generator().manual_seed(seed)
    seq = max(p + r for p, r in zip(PROMPT_LENGTHS, RESPONSE_LENGTHS))
    input_ids = torch.full((ROWS, seq), PAD_ID, dtype=torch.long)
    attention_mask = torch.zeros(ROWS, seq, dtype=torch.long)
    response_mask = torch.zeros(ROWS, seq, dtype=torch.float32)
    for i, (p, r) in enumerate(zip(PROMPT_LENGTHS, RESPONSE_LENGTHS)):
        input_ids[i, : p + r] = torch.randint(1, vocab, (p + r,), generator=gen)
        attention_mask[i, : p + r] = 1
        response_mask[i, p : p + r] = 1.0
    advantages = torch.randn(ROWS, 1, generator=gen).expand(ROWS, seq) * response_mask
    returns = torch.randn(ROWS, seq, generator=gen) * response_mask
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "response_mask": response_mask,
        "advantages": advantages.contiguous(),
        "returns": returns,
    }


def hf_logprobs_entropy(model, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Aligned with the token: out[:, t] from the logits at t - 1; 0 at position 0 and on padding."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    logprobs = (
        torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    )
    entropy = entropy_from_logits(logits[:, :-1])
    mask = batch["attention_mask"][:, 1:].to(logprobs.dtype)
    zero = torch.zeros(logprobs.shape[0], 1)
    return torch.cat([zero, logprobs * mask], 1), torch.cat([zero, entropy * mask], 1)


def hf_reference(model_dir, batch_seed: int = 0, noise_seed: int = 1) -> tuple[dict, dict]:
    """(batch with old_logprobs, {"logprobs", "entropy", "grads", "loss"}) on the HF model in float32.

    old_logprobs = HF log-probs + noise, so that ratios differ from 1 and some tokens are clipped; the
    gradients are those of the jobs' pg_loss over the whole batch (token-mean over response tokens).
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()  # dropout is 0 in every tiny model; eval only silences training-mode code paths
    batch = make_batch(model.config.vocab_size, batch_seed)
    with torch.no_grad():
        logprobs, entropy = hf_logprobs_entropy(model, batch)
    noise = 0.3 * torch.randn(logprobs.shape, generator=torch.Generator().manual_seed(noise_seed))
    batch["old_logprobs"] = ((logprobs + noise) * batch["response_mask"]).contiguous()
    model.zero_grad()
    loss, _ = pg_loss(*hf_logprobs_entropy(model, batch), batch)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return batch, {"logprobs": logprobs, "entropy": entropy, "grads": grads, "loss": loss.item()}
