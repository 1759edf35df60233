"""Workers: the processes' roles in a step (Megatron training/forward, SGLang rollout, reward)."""
