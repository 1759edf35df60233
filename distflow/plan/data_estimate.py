"""The data plan of one RL step in numbers: samples and tokens per rollout DP rank (engine) and per training
DP rank, mini- and micro-batches. Token counts are upper bounds (every sample at its maximum length):
actual lengths are only known after generation, where the data coordinator balances them by tokens.
"""

import math
from dataclasses import dataclass, field

from distflow.config.schema import DistFlowConfig


@dataclass(frozen=True)
class DataEstimate:
    prompts: int
    samples_per_prompt: int
    num_engines: int
    train_dp: int
    max_seq_len: int
    mini_batches: int
    """Optimizer steps per RL step and PPO epoch."""
    ppo_epochs: int
    tokens_per_micro_batch: int
    micro_batches: int
    """Micro-batches of one mini-batch on one training DP rank (upper bound)."""
    notes: list[str] = field(default_factory=list)

    @property
    def samples(self) -> int:
        return self.prompts * self.samples_per_prompt

    @property
    def prompts_per_engine(self) -> float:
        return self.prompts / self.num_engines

    @property
    def samples_per_train_dp(self) -> float:
        return self.samples / self.train_dp

    @property
    def max_tokens(self) -> int:
        return self.samples * self.max_seq_len

    @property
    def max_tokens_per_train_dp(self) -> float:
        return self.max_tokens / self.train_dp


def micro_batch_tokens(role_cfg, max_seq_len: int) -> int:
    """Tokens of one training micro-batch: the token budget, or micro_batch_size full-length sequences."""
    if role_cfg.use_dynamic_batch:
        return role_cfg.max_tokens_per_micro_batch
    return role_cfg.micro_batch_size * max_seq_len


def micro_batches(role_cfg, prompts: int, samples_per_prompt: int, dp: int, max_seq_len: int) -> int:
    """Micro-batches of one mini-batch on one DP rank of a training role, at full-length samples."""
    mini_prompts = role_cfg.mini_batch_size or prompts
    samples = math.ceil(mini_prompts * samples_per_prompt / dp)
    if role_cfg.use_dynamic_batch:
        return max(1, math.ceil(samples * max_seq_len / role_cfg.max_tokens_per_micro_batch))
    return max(1, math.ceil(samples / role_cfg.micro_batch_size))


def estimate_data(cfg: DistFlowConfig, num_engines: int, train_dp: int) -> DataEstimate:
    """Numbers of one step for `num_engines` rollout DP ranks and `train_dp` actor DP ranks (x CP ranks
    sharing each DP rank's sequences)."""
    prompts, n, actor = cfg.data.train_batch_size, cfg.rollout.n, cfg.actor
    max_seq_len = cfg.data.max_prompt_length + cfg.rollout.max_new_tokens
    mini_prompts = actor.mini_batch_size or prompts
    mini_batches = max(1, prompts // mini_prompts)
    notes = []
    if prompts % num_engines:
        notes.append(
            f"data.train_batch_size={prompts} prompts do not split evenly over {num_engines} engines: "
            "some engines get one prompt more"
        )
    if prompts % mini_prompts:
        notes.append(
            f"actor.mini_batch_size={mini_prompts} does not divide data.train_batch_size={prompts}: "
            f"{prompts % mini_prompts} prompts per step fall outside the {mini_batches} mini-batches"
        )
    if (mini_prompts * n) % train_dp:
        notes.append(
            f"a mini-batch of {mini_prompts * n} samples does not split evenly over {train_dp} training "
            "DP ranks: the data coordinator balances tokens, some ranks get one sample more"
        )
    tokens = micro_batch_tokens(actor, max_seq_len)
    if actor.use_dynamic_batch and tokens < max_seq_len:
        notes.append(
            f"actor.max_tokens_per_micro_batch={tokens} is below one full-length sample "
            f"({cfg.data.max_prompt_length} + {cfg.rollout.max_new_tokens} = {max_seq_len} tokens)"
        )
    if cfg.algorithm.dynamic_sampling:
        notes.append(
            f"dynamic sampling: up to algorithm.max_sampling_attempts={cfg.algorithm.max_sampling_attempts} "
            "generation rounds per step until every kept group has differing rewards"
        )
    return DataEstimate(
        prompts=prompts,
        samples_per_prompt=n,
        num_engines=num_engines,
        train_dp=train_dp,
        max_seq_len=max_seq_len,
        mini_batches=mini_batches,
        ppo_epochs=actor.ppo_epochs,
        tokens_per_micro_batch=tokens,
        micro_batches=micro_batches(actor, prompts, n, train_dp, max_seq_len),
        notes=notes,
    )
