"""Optional supervised warm-up before RL (trainer.sft_warmup_steps) on the training prompts' answers.

Why: a randomly initialised tiny model almost never emits a rewarded token, so every group's rewards are
equal and GRPO has no signal (shared/research/toy_grpo.md: "sparse rewards need a short supervised
warm-up"). A few steps of next-token loss on (prompt, ground truth + EOS) give the policy a starting
point; RL then has to do the rest. Real runs start from an instruct model and leave this at 0.
"""

import random

import torch


def sft_warmup(actor, tokenizer, dataset, steps: int, batch_size: int, seed: int) -> list[float]:
    """Runs `steps` optimizer steps on the actor; returns the losses. Every rank draws the same rows and
    keeps its data-parallel share, so no data moves."""
    from megatron.core import parallel_state  # Megatron-Core is imported only once a worker exists

    eos = tokenizer.eos_token_id
    rng = random.Random(seed)
    dp, dp_rank = parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank()
    losses = []
    for _ in range(steps):
        prompts = [dataset[rng.randrange(len(dataset))] for _ in range(batch_size)][dp_rank::dp]
        rows = []
        for p in prompts:
            answer = tokenizer.encode(str(p.ground_truth), add_special_tokens=False) + [eos]
            rows.append((list(p.input_ids), answer))
        width = max(len(q) + len(a) for q, a in rows)
        batch = {
            "input_ids": torch.zeros((len(rows), width), dtype=torch.long),
            "attention_mask": torch.zeros((len(rows), width), dtype=torch.long),
            "response_mask": torch.zeros((len(rows), width), dtype=torch.float32),
        }
        for i, (q, a) in enumerate(rows):
            batch["input_ids"][i, : len(q) + len(a)] = torch.tensor(q + a)
            batch["attention_mask"][i, : len(q) + len(a)] = 1
            batch["response_mask"][i, len(q) : len(q) + len(a)] = 1.0

        def loss_fn(logprobs, entropy, mb):
            mask = mb["response_mask"]
            loss = -(logprobs * mask).sum() / mask.sum().clamp(min=1)
            return loss, {"sft_loss": loss.detach()}

        losses.append(float(actor.train_step(batch, loss_fn)["loss"]))
    return losses


def reference_from_actor(actor, ref) -> None:
    """Makes the warmed-up actor the KL reference: RL's KL term measures the distance from the policy RL
    starts from, not from the random weights before the warm-up. The reference shares the actor's layout
    (one set of Megatron groups per process), so each rank copies its own shards, parameter for parameter."""
    for actor_chunk, ref_chunk in zip(actor.chunks, ref.chunks, strict=True):
        ref_chunk.load_state_dict(actor_chunk.state_dict(), strict=True)
