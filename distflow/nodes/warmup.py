"""Optional supervised warm-up before RL (trainer.sft_warmup_steps) on the training prompts' answers.

Why: a randomly initialised tiny model almost never emits a rewarded token, so every group's rewards are
equal and GRPO has no signal (shared/research/toy_grpo.md: "sparse rewards need a short supervised
warm-up"). A few steps of next-token loss on (prompt, ground truth + EOS) give the policy a starting
point; RL then has to do the rest. A multi-turn task's rows carry a demonstration instead
(extra_info.sft_turns: the tool call, the tool's answer, the final answer), trained on its policy turns. Real runs start from an instruct model and leave this at 0.
"""

import functools
import random

import torch

from distflow.envs.observations import ObservationEncoder


def sft_warmup(actor, tokenizer, dataset, steps: int, batch_size: int, seed: int) -> list[float]:
    """Runs `steps` optimizer steps on the actor; returns the losses. Every rank draws the same rows and
    keeps its data-parallel share, so no data moves."""
    from megatron.core import parallel_state  # Megatron-Core is imported only once a worker exists

    rng = random.Random(seed)
    dp, dp_rank = parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank()
    losses = []
    for _ in range(steps):
        prompts = [dataset[rng.randrange(len(dataset))] for _ in range(batch_size)][dp_rank::dp]
        rows = [(list(p.input_ids), *demonstration(tokenizer, p)) for p in prompts]
        width = max(len(q) + len(a) for q, a, _ in rows)
        batch = {
            "input_ids": torch.zeros((len(rows), width), dtype=torch.long),
            "attention_mask": torch.zeros((len(rows), width), dtype=torch.long),
            "response_mask": torch.zeros((len(rows), width), dtype=torch.float32),
        }
        for i, (q, a, mask) in enumerate(rows):
            batch["input_ids"][i, : len(q) + len(a)] = torch.tensor(q + a)
            batch["attention_mask"][i, : len(q) + len(a)] = 1
            batch["response_mask"][i, len(q) : len(q) + len(a)] = torch.tensor(mask, dtype=torch.float32)

        def loss_fn(logprobs, entropy, mb):
            mask = mb["response_mask"]
            loss = -(logprobs * mask).sum() / mask.sum().clamp(min=1)
            return loss, {"sft_loss": loss.detach()}

        losses.append(float(actor.train_step(batch, loss_fn)["loss"]))
    return losses


def demonstration(tokenizer, prompt) -> tuple[list[int], list[float]]:
    """(response ids, loss mask) the warm-up imitates for a prompt: the ground truth and EOS; or, for a
    multi-turn task, the turns of its extra_info.sft_turns as a trajectory would hold them (the policy's
    turns, each ended by EOS, with mask 1; the tools' answers as the chat template's tool turns, mask 0)."""
    eos = tokenizer.eos_token_id
    turns = (prompt.extra_info or {}).get("sft_turns")
    if not turns:
        answer = tokenizer.encode(str(prompt.ground_truth), add_special_tokens=False) + [eos]
        return answer, [1.0] * len(answer)
    encoder = _encoder(tokenizer)
    ids, mask = [], []
    for turn in turns:
        if turn["role"] == "assistant":
            said = tokenizer.encode(turn["content"], add_special_tokens=False) + [eos]
            ids, mask = ids + said, mask + [1.0] * len(said)
        else:
            answer = encoder.ids(turn["content"], turn_ended=True)
            ids, mask = ids + answer, mask + [0.0] * len(answer)
    return ids, mask


@functools.cache  # one per tokenizer (identity-hashed): it renders the chat template twice to build
def _encoder(tokenizer) -> ObservationEncoder:
    return ObservationEncoder(tokenizer)


def reference_from_actor(actor, ref) -> None:
    """Makes the warmed-up actor the KL reference: RL's KL term measures the distance from the policy RL
    starts from, not from the random weights before the warm-up. The reference shares the actor's layout
    (one set of Megatron groups per process), so each rank copies its own shards, parameter for parameter."""
    for actor_chunk, ref_chunk in zip(actor.chunks, ref.chunks, strict=True):
        ref_chunk.load_state_dict(actor_chunk.state_dict(), strict=True)
