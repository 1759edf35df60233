"""Builds the reward-model worker of a run (reward.model_path) on the actor's ranks and layout."""

import dataclasses

from distflow.config import ConfigError
from distflow.config.schema import MegatronRoleConfig, RefConfig
from distflow.workers.megatron.worker import MegatronWorker


def build_reward_model(cfg, layout, policy_tokenizer, device: str):
    """A forward-only MegatronWorker (role "reward") with the actor's parallel and batching options.

    The reward model reads the policy's token ids as they are, so its tokenizer must be the policy's: a
    different vocabulary would need decoding and re-tokenizing every sample, which is not done here.
    """
    from transformers import AutoTokenizer  # noqa: PLC0415 - transformers is heavy: only when a reward model is built

    path = cfg.reward.model_path
    if AutoTokenizer.from_pretrained(path).get_vocab() != policy_tokenizer.get_vocab():
        raise ConfigError(
            f"reward.model_path={path!r}: its tokenizer differs from the policy's "
            f"({cfg.model.tokenizer_path or cfg.model.path}); the reward model must share the "
            "policy's vocabulary (re-tokenizing samples for a different one is not supported)"
        )
    shared = {
        f.name: getattr(cfg.actor, f.name)
        for f in dataclasses.fields(MegatronRoleConfig)
        if f.name not in ("load", "offload")
    }
    model_cfg = dataclasses.replace(cfg.model, path=path, tokenizer_path=None)
    return MegatronWorker("reward", RefConfig(**shared), model_cfg, layout, device)
