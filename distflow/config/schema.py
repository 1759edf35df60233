"""The typed DistFlow config tree: every section and field, with its documentation.

Each field is declared with `option(default, help)`; the help text is what `python -m distflow.config docs`
prints. Megatron-Core and SGLang settings that DistFlow does not model itself pass through untouched under
`<role>.megatron` (TransformerConfig fields) and `rollout.sglang` (SGLang ServerArgs fields); their keys are
checked against those libraries (see passthrough.py).
"""

from dataclasses import dataclass, field
from typing import Literal, Optional

from distflow.config.algorithm import ESTIMATOR_NAMES
from distflow.config.dtypes import DtypeName


def option(default, help: str):
    """A config field with a default and its documentation."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help})
    return field(default=default, metadata={"help": help})


def section(cls, help: str):
    """A nested config section."""
    return field(default_factory=cls, metadata={"help": help})


@dataclass
class ModelConfig:
    path: str = option(
        "", "Hugging Face model directory (config.json, *.safetensors, tokenizer) to start from."
    )
    tokenizer_path: Optional[str] = option(None, "Tokenizer directory; defaults to model.path.")
    dtype: DtypeName = option(
        "bfloat16", "Compute dtype of training and rollout. float32 on CPU (no fast bf16 matmul there)."
    )


@dataclass
class OptimizerConfig:
    lr: float = option(1e-6, "Peak learning rate.")
    min_lr: float = option(0.0, "Final learning rate of the decay schedule.")
    lr_warmup_steps: int = option(0, "Linear warm-up steps (optimizer steps).")
    lr_decay_style: Literal["constant", "linear", "cosine"] = option("constant", "Decay after warm-up.")
    weight_decay: float = option(0.01, "AdamW weight decay.")
    adam_beta1: float = option(0.9, "Adam beta1.")
    adam_beta2: float = option(0.999, "Adam beta2.")
    adam_eps: float = option(1e-8, "Adam epsilon.")
    clip_grad: float = option(1.0, "Global gradient-norm clip; 0 disables.")
    use_distributed_optimizer: bool = option(
        True, "Shard optimizer states over data-parallel ranks (ZeRO-1)."
    )
    megatron: dict = option(
        {},
        "Extra Megatron-Core OptimizerConfig fields, passed through unchanged (e.g. "
        "optimizer_cpu_offload: true, optimizer_offload_fraction: 1.0 on GPU).",
    )


@dataclass
class MegatronRoleConfig:
    """Parallel layout and execution options shared by the Megatron roles (actor, critic, reference)."""

    tp: int = option(1, "Tensor-parallel size.")
    pp: int = option(1, "Pipeline-parallel size.")
    vpp: int = option(1, "Virtual pipeline stages per pipeline rank (interleaved 1F1B); 1 disables.")
    cp: int = option(1, "Context-parallel size (needs Transformer Engine: GPU only).")
    ep: int = option(1, "Expert-parallel size (MoE).")
    etp: Optional[int] = option(None, "Expert tensor-parallel size (MoE); defaults to tp.")
    sequence_parallel: bool = option(False, "Megatron sequence parallelism (needs tp > 1).")
    micro_batch_size: int = option(1, "Sequences per micro-batch when dynamic batching is off.")
    use_dynamic_batch: bool = option(True, "Pack micro-batches by a token budget instead of a fixed count.")
    max_tokens_per_micro_batch: int = option(8192, "Token budget of one micro-batch (dynamic batching).")
    recompute_granularity: Optional[Literal["full", "selective"]] = option(
        None, "Activation recomputation (Megatron's recompute_granularity); null disables."
    )
    recompute_method: Optional[Literal["uniform", "block"]] = option(None, "Megatron's recompute_method.")
    recompute_num_layers: Optional[int] = option(None, "Megatron's recompute_num_layers.")
    offload: bool = option(
        False,
        "ref only: keep the reference model's parameters in CPU memory between "
        "forwards (GPU; nothing to move on CPU). actor/critic refuse it: their optimizer "
        "states offload through optim.megatron.optimizer_cpu_offload (GPU).",
    )
    load: Optional[str] = option(None, "Megatron dist checkpoint to start from instead of model.path.")
    megatron: dict = option({}, "Extra Megatron-Core TransformerConfig fields, passed through unchanged.")


@dataclass
class ActorConfig(MegatronRoleConfig):
    mini_batch_size: int = option(0, "Prompts per optimizer step; 0 = the whole rollout batch (one update).")
    ppo_epochs: int = option(1, "Passes over each rollout batch.")
    moe_routing_replay: bool = option(
        False,
        "MoE only: the engines return the experts they routed each token to, and the actor's forwards (old "
        "log-probs and the update) use those experts instead of routing again (rollout routing replay, R3).",
    )
    optim: OptimizerConfig = section(OptimizerConfig, "Actor optimizer and LR schedule.")


# The parallel sizes of a Megatron role, the fields that make its ParallelLayout.
LAYOUT_FIELDS = ("tp", "pp", "vpp", "cp", "ep", "etp")
_FOLLOWS = (
    "unset: the actor's (the {role} shares the actor's Megatron process groups, so only that value fits)"
)


@dataclass
class FollowsActorLayout:
    """The parallel sizes of a role that runs in the actor's Megatron process groups (reference, critic): each
    unset one is the actor's (DistFlowConfig.parallel_sizes); an explicit different one is a LayoutError."""

    tp: Optional[int] = option(None, f"Tensor-parallel size; {_FOLLOWS}.")
    pp: Optional[int] = option(None, f"Pipeline-parallel size; {_FOLLOWS}.")
    vpp: Optional[int] = option(None, f"Virtual pipeline stages per pipeline rank; {_FOLLOWS}.")
    cp: Optional[int] = option(None, f"Context-parallel size; {_FOLLOWS}.")
    ep: Optional[int] = option(None, f"Expert-parallel size (MoE); {_FOLLOWS}.")
    etp: Optional[int] = option(None, f"Expert tensor-parallel size (MoE); {_FOLLOWS}.")


@dataclass
class CriticConfig(FollowsActorLayout, ActorConfig):
    enable: bool = option(False, "Train a critic (PPO with GAE). Turned on by algorithm.adv_estimator=gae.")
    path: Optional[str] = option(None, "HF checkpoint to initialise the critic from; defaults to model.path.")


@dataclass
class RefConfig(FollowsActorLayout, MegatronRoleConfig):
    enable: bool = option(True, "Keep a frozen reference model for the KL term (off when no KL is used).")


@dataclass
class RolloutConfig:
    placement: Literal["colocated", "disaggregated"] = option(
        "colocated",
        "colocated: every rank trains and hosts its share of an engine; disaggregated: the last "
        "rollout.num_ranks ranks host engines only.",
    )
    num_ranks: int = option(0, "Ranks that host engines in disaggregated placement (0 when colocated).")
    engine_tp: int = option(1, "Tensor-parallel size of one SGLang engine; one engine per engine_tp ranks.")
    n: int = option(8, "Samples per prompt (the GRPO group size).")
    temperature: float = option(1.0, "Sampling temperature.")
    top_p: float = option(1.0, "Nucleus sampling threshold.")
    top_k: int = option(-1, "Top-k sampling; -1 disables.")
    max_new_tokens: int = option(512, "Maximum response length in tokens.")
    stop: list[str] = option([], "Stop strings.")
    stop_token_ids: list[int] = option([], "Stop token ids (the tokenizer's EOS is always one).")
    env: Optional[str] = option(
        None,
        "Multi-turn rollouts: the environment that answers the policy between its turns: a built-in "
        "(single_turn, calculator, python, lookup) or a user class 'module:Class' / 'path/file.py:Class' "
        "(distflow/envs). null: one response per prompt.",
    )
    max_turns: int = option(1, "Multi-turn: the most policy turns in a trajectory (rollout.env).")
    max_total_tokens: Optional[int] = option(
        None,
        "Multi-turn: the most response tokens of a trajectory, the policy's and the environment's together; "
        "null = max_new_tokens x max_turns. max_new_tokens bounds each turn.",
    )
    tool_parser: str = option(
        "hermes",
        "Multi-turn: how tool calls are read from a turn's text: hermes (<tool_call>{json}</tool_call>: "
        "Qwen2.5/Qwen3/Hermes templates), llama3_json, or a user class 'module:Class'.",
    )
    env_timeout_s: float = option(
        30.0, "Multi-turn: the longest one environment step may take; past it the trajectory ends."
    )
    mem_fraction_static: Optional[float] = option(
        None, "Fraction of GPU memory for the engine's weights and KV cache; null = SGLang's default."
    )
    release_memory_in_training: bool = option(
        True, "Colocated: engines free their GPU memory while training runs (no-op on CPU)."
    )
    sglang: dict = option({}, "Extra SGLang ServerArgs fields, passed through to sglang.Engine unchanged.")
    balance: Literal["steal", "partition"] = option(
        "steal",
        "With several engines: steal: an engine whose own prompts are all claimed takes chunks of the "
        "engine with the most unclaimed estimated tokens (results go back to their home engine); partition: each "
        "engine generates only its own prompts.",
    )
    balance_chunk_prompts: int = option(8, "Prompt groups (all n samples of a prompt) per claimable chunk.")
    balance_outstanding_tokens: int = option(
        262144,
        "An engine claims more chunks while its claimed-but-unfinished chunks' estimated tokens (prompt "
        "+ n x max_new_tokens) stay below this (at least one chunk; one at a time where seeded samples depend "
        "on the batch, as on CPU).",
    )
    balance_timeout_s: Optional[float] = option(
        None,
        "Longest wait for other engines' chunk plans, stolen chunks' samples and totals in a step; null: "
        "trainer.dist_timeout_s (the job's bound on every wait).",
    )
    call_timeout_s: Optional[float] = option(
        None,
        "Longest an engine call may take (a generate over the step's batch, a weight update) before the engine "
        "counts as stalled and the run stops with an error naming it; null: trainer.dist_timeout_s (the job's "
        "bound on every wait). Raise it for rollouts that take longer.",
    )
    engine_restarts: int = option(
        2,
        "How often each engine may be restarted in place in one attempt after its processes die or stall. With "
        "several engines, a dead engine's unfinished chunks of the rollout go to the others (same seeds, same "
        "samples) while it restarts, and the next weight sync loads the current weights into it; a death in a "
        "sync restarts it and the sync runs again. With no live engine to take them (one engine, or all dead): "
        "it restarts, the weights are synced into it again and its prompts are generated again (same seeds); "
        "colocated, at once; disaggregated, when the rollout's step takes it (with that step's weights if the "
        "rollout was generated ahead). Partial rollouts in flight continue on the restarted engine from the "
        "tokens they had. An engine over nodes restarts in a weight sync, all its nodes' ranks together. "
        "DAPO with training-only ranks: the round is generated again after a resync. Spent or 0: the "
        "job stops naming the engine, and a torchrun restart resumes it from its last checkpoint. Metric "
        "rollout/engine_restarts. See docs/fault_tolerance.md.",
    )
    max_staleness: int = option(
        0,
        "Bounded staleness: a sample may be trained on by a policy up to this many weight versions newer "
        "than the one that sampled it. 0: lock-step (generate, train, sync, in turn); k > 0: the engines "
        "generate the batches of the next k steps while the trainer trains this one (disaggregated "
        "placement: generation overlaps training; colocated: the devices are time-shared, so nothing "
        "overlaps). See docs/async.md.",
    )
    partial: bool = option(
        False,
        "Partial rollouts (max_staleness > 0, disaggregated): the rollouts generated ahead stay in flight "
        "through the weight sync; it interrupts them and they continue under the new weights, each token "
        "tagged with the version that sampled it (rollout/partial_fraction). The sync then never waits for "
        "generation to end; where it falls depends on timing, so samples are not bit-reproducible. See "
        "docs/async.md.",
    )
    dtype: Optional[DtypeName] = option(
        None,
        "The engines' compute dtype; null: model.dtype. A bf16 engine against an fp32 trainer samples from a "
        "slightly different policy (rollout_corr/* metrics; algorithm.rollout_correction corrects for it).",
    )
    stream_chunks: int = option(
        4,
        "Lock-step disaggregated runs: the samples move to the training ranks in this many parts, all but "
        "the last while the engines still generate (each engine's finished prompt groups), and the old- "
        "and reference-log-prob passes run on each part as it arrives instead of after the last response "
        "(timing_s/stream_logprobs, perf/logprobs_streamed). 1: the batch moves whole after generation. "
        "No effect when colocated, at max_staleness > 0, or without a log-prob pass in the actor's layout. "
        "See docs/async.md.",
    )
    engine_nnodes: int = option(
        1,
        "Nodes one engine spans (engine_tp larger than a node's GPUs): engine_tp / engine_nnodes of its ranks "
        "on each node. The engine's first rank on every node starts SGLang's processes for that node (SGLang's "
        "nnodes/node_rank, rendezvous at the engine owner's address); the owner (first node) serves requests.",
    )


@dataclass
class SyncConfig:
    bucket_mb: float = option(
        512, "Size bound of one weight-sync bucket, in MiB (a larger parameter travels as row ranges)."
    )
    verify: bool = option(
        False, "After each sync, compare per-bucket checksums of engine and trainer weights."
    )
    method: Literal["auto", "reshard", "full"] = option(
        "auto",
        "auto: the layout-aware resharder (each engine rank receives its own shards where the family has "
        "an SGLang shard layout, else full HF-named tensors staged the same way); reshard: the resharder, "
        "shards only (an error for families without a shard layout); full: gather the full HF tensors on "
        "rank 0 and broadcast them to every engine owner (the simple fallback).",
    )
    transport: Literal["auto", "shared_memory", "process_group"] = option(
        "auto",
        "How a training rank's slices reach an engine rank hosted by another rank: shared_memory writes "
        "them into the engine rank's staging buffer (same node: shared memory on CPU, CUDA IPC on GPU); "
        "process_group sends them over a weight-update process group (gloo on CPU, NCCL on GPU; engines on other "
        "nodes than their senders, e.g. disaggregated placement); auto: shared memory within a node, the process "
        "group across nodes.",
    )


@dataclass
class RolloutCorrectionConfig:
    is_level: Literal["none", "token", "sequence"] = option(
        "none",
        "Truncated importance sampling against the engine's log-probs (TIS): each token's policy loss is "
        "weighed by pi_prox / mu (token) or its product over the response (sequence), capped at is_cap. "
        "With a correction on, the PPO ratio is taken against the proximal policy (decoupled PPO). See "
        "docs/rollout_correction.md.",
    )
    is_cap: float = option(2.0, "Largest importance weight kept (TIS truncation).")
    mask_level: Literal["none", "token", "sequence"] = option(
        "none",
        "Masked importance sampling (IcePop-style): tokens whose pi_prox / mu (token), or every token of a "
        "response whose geometric-mean ratio (sequence), leaves [mask_low, mask_high] add nothing to the loss.",
    )
    mask_low: float = option(0.5, "Lowest ratio pi_prox / mu kept by the mask.")
    mask_high: float = option(2.0, "Highest ratio pi_prox / mu kept by the mask.")

    @property
    def enabled(self) -> bool:
        return self.is_level != "none" or self.mask_level != "none"


@dataclass
class AlgorithmConfig:
    adv_estimator: Literal[ESTIMATOR_NAMES] = option("grpo", "Advantage estimator.")
    norm_adv_by_std: bool = option(True, "GRPO: divide by the group's std (false gives Dr. GRPO).")
    gamma: float = option(1.0, "Discount (GAE, REINFORCE++).")
    lam: float = option(1.0, "GAE lambda.")
    policy_loss: Literal["ppo", "gspo"] = option(
        "ppo", "ppo: token-level clipped ratio; gspo: sequence ratio."
    )
    clip_ratio_low: float = option(0.2, "Lower clip range (1 - low).")
    clip_ratio_high: float = option(0.2, "Upper clip range (1 + high); DAPO's clip-higher raises it.")
    clip_ratio_c: float = option(3.0, "Dual-clip bound for negative advantages.")
    loss_agg_mode: Literal[
        "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
    ] = option("token-mean", "How token losses are aggregated.")
    entropy_coef: float = option(0.0, "Entropy bonus coefficient.")
    kl_coef: float = option(0.0, "KL-to-reference coefficient; 0 disables the reference model.")
    kl_estimator: Literal["k1", "k2", "k3"] = option("k3", "KL estimator (k3: low-variance).")
    kl_in_reward: bool = option(False, "Apply KL as a reward penalty instead of a loss term.")
    value_clip: float = option(0.5, "Critic value clip range (PPO).")
    dynamic_sampling: bool = option(False, "DAPO: drop groups whose rewards are all equal, refill the batch.")
    max_sampling_attempts: int = option(3, "DAPO: generation rounds before training on a partial batch.")
    overlong_buffer_len: int = option(0, "DAPO overlong shaping: penalty ramp length in tokens; 0 disables.")
    overlong_penalty_factor: float = option(1.0, "DAPO overlong shaping: maximum penalty.")
    rollout_correction: RolloutCorrectionConfig = section(
        RolloutCorrectionConfig,
        "Correction for the engine's and the trainer's probabilities differing (numerics, staleness).",
    )


@dataclass
class DagConfig:
    pipeline: str = option("grpo", "Built-in pipeline name or a user pipeline as 'module:function'.")


@dataclass
class DataConfig:
    train_files: list[str] = option(
        [],
        "Training data files: .parquet, .jsonl or .json rows (prompt, data_source, "
        "reward_model, extra_info); one path or a list.",
    )
    val_files: list[str] = option([], "Held-out data files (as data.train_files).")
    prompt_key: str = option("prompt", "Column holding the chat messages.")
    max_prompt_length: int = option(512, "Prompts longer than this (tokens) are filtered out.")
    train_batch_size: int = option(64, "Prompts per RL step (over all ranks).")
    val_batch_size: int = option(256, "Prompts per validation batch.")
    shuffle: bool = option(True, "Shuffle every epoch.")
    seed: int = option(1, "Data order seed.")
    skip_bad_rows: bool = option(
        False, "Skip (and count) rows that do not follow the schema instead of failing on the first one."
    )


@dataclass
class RewardConfig:
    name: str = option(
        "gsm8k",
        "Built-in rule-based scorer: gsm8k (lenient '#### answer'), gsm8k_flexible (the last number), "
        "gsm8k_verl (verl's strict rule, for numbers comparable with verl baselines), math (boxed answer, "
        "math-verify), math_dapo (DAPO's 'Answer:' rule, +1/-1), copy, or auto (chosen per sample from its "
        "data_source; see distflow/rewards/registry.py).",
    )
    custom: Optional[str] = option(
        None,
        "Custom scorer as 'module:function' or 'path/to/file.py:function' (verl's "
        "custom_reward_function); checked against the scorer contract before the start.",
    )
    model_path: Optional[str] = option(
        None,
        "Reward model: a HF *ForSequenceClassification checkpoint (one label) sharing the policy's tokenizer; "
        "it scores training samples (Megatron forward in the actor's layout). Validation still uses reward.name.",
    )
    timeout_s: float = option(
        10.0, "Per-sample scorer timeout; a timeout scores 0 and counts in reward/timeouts."
    )
    num_workers: int = option(2, "Scorer process-pool size.")
    env_reward_coef: float = option(
        0.0,
        "Multi-turn (rollout.env): each trajectory's score gets coef x the sum of its environment's per-step "
        "rewards (StepResult.reward: per-turn rewards, e.g. a tool call that worked) added to the outcome the "
        "scorer gives its final turn; 0: the per-step rewards are recorded, not used.",
    )
    stream: bool = option(
        True,
        "Score each prompt group as soon as its responses have all finished, while the others still "
        "generate (the pool's workers run beside the engine); false: score the whole batch after generation. "
        "Applies to the training rollout's rule-based and custom rewards (not to reward.model_path, nor to "
        "rollouts submitted ahead under rollout.partial).",
    )


@dataclass
class TrainerConfig:
    total_steps: int = option(100, "RL steps to run.")
    seed: int = option(1, "Global seed (model init, sampling).")
    val_every: int = option(0, "Validate every k steps; 0 disables.")
    sft_warmup_steps: int = option(
        0,
        "Supervised steps on the training answers before RL (for models that start "
        "from random weights, e.g. the CPU toy task); 0 disables.",
    )
    output_dir: str = option("outputs/run", "Where metrics, checkpoints and the exported model go.")
    device: Literal["auto", "cpu", "cuda"] = option("auto", "auto: cuda when available, else cpu (gloo).")
    dist_timeout_s: int = option(600, "Timeout of every collective and process-group set-up, in seconds.")
    max_consecutive_bad_steps: int = option(
        3,
        "Optimizer steps in a row with a NaN/Inf loss or NaN/Inf gradients (each one skipped) after which "
        "the run stops with an error.",
    )
    profile_steps: list[int] = option(
        [],
        "RL steps to record a torch.profiler trace of (e.g. [3, 10]), one Chrome/TensorBoard trace per rank "
        "and step under <output_dir>/profile/rank<k>/ (chrome://tracing, Perfetto or TensorBoard's profiler "
        "plugin); [] profiles nothing. See docs/metrics.md.",
    )


@dataclass
class TrackingConfig:
    project: str = option("distflow", "W&B project / run group.")
    run_name: Optional[str] = option(None, "Run name; defaults to the output folder's name.")
    backends: list[str] = option(["console", "jsonl"], "Any of console, jsonl, wandb, tensorboard.")
    wandb_mode: Literal["auto", "online", "offline", "disabled"] = option(
        "auto", "auto: online with WANDB_API_KEY set, else offline."
    )
    metric_names: Literal["distflow", "verl"] = option(
        "distflow",
        "Names metrics are written under: distflow (docs/metrics.md), or verl (those with a verl twin "
        "under verl's name: reward/mean -> critic/score/mean, timing_s/generate -> timing_s/gen, ...).",
    )
    val_samples: int = option(
        8,
        "Validation samples (prompt, response, reward) logged as a table per validation "
        "(W&B table, TensorBoard text, samples.jsonl); 0 logs none.",
    )


@dataclass
class CheckpointConfig:
    save_every: int = option(0, "Save every k steps; 0 saves only at the end.")
    keep_last: int = option(2, "Checkpoints to keep.")
    resume: str = option(
        "auto",
        "auto (the newest intact checkpoint in output_dir, if any), never, or a checkpoint path.",
    )
    checksums: bool = option(
        True,
        "Record every checkpoint file's SHA-256 in its manifest and check them on resume (each rank reads "
        "its share of the files once per save and resume); false: file names and sizes only.",
    )
    export_hf: bool = option(True, "Export the final actor to Hugging Face safetensors.")


@dataclass
class DistFlowConfig:
    model: ModelConfig = section(ModelConfig, "The model being trained.")
    actor: ActorConfig = section(ActorConfig, "Actor: the policy being trained (Megatron).")
    critic: CriticConfig = section(CriticConfig, "Critic: the value model (Megatron, PPO only).")
    ref: RefConfig = section(RefConfig, "Reference policy for the KL term (Megatron, forward only).")
    rollout: RolloutConfig = section(RolloutConfig, "SGLang rollout engines.")
    sync: SyncConfig = section(SyncConfig, "Weight sync from Megatron into the engines.")
    algorithm: AlgorithmConfig = section(AlgorithmConfig, "Advantages, losses and KL.")
    dag: DagConfig = section(DagConfig, "The workflow graph every rank runs.")
    data: DataConfig = section(DataConfig, "Training and validation data.")
    reward: RewardConfig = section(RewardConfig, "Reward functions.")
    trainer: TrainerConfig = section(TrainerConfig, "The training loop.")
    tracking: TrackingConfig = section(TrackingConfig, "Metrics tracking.")
    checkpoint: CheckpointConfig = section(CheckpointConfig, "Checkpointing and resume.")

    def parallel_sizes(self, role: str) -> dict:
        """The parallel sizes {tp, pp, vpp, cp, ep, etp} of `role` (actor, ref, critic): the role's own where set,
        else the actor's. etp may be None: that layout's tp (ParallelLayout.for_world)."""
        own, actor = getattr(self, role), self.actor
        return {
            name: getattr(actor, name) if getattr(own, name) is None else getattr(own, name)
            for name in LAYOUT_FIELDS
        }
