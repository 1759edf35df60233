"""MegatronWorker: one role's Megatron-Core model on this rank (actor, reference or critic).

Every rank of the role's layout builds one worker; Megatron's parallel_state must already hold that
layout (distflow.distributed.initialize_megatron_groups). Each data-parallel rank passes its own rows
(moving rows between ranks is the data coordinator's job); the ranks of one data-parallel replica
(its TP and PP ranks) pass the same rows and get the same results.

Batches are dicts of tensors with one row per sequence:
  input_ids       [B, S] prompt + response, right-padded;
  attention_mask  [B, S] 1 on real tokens;
  response_mask   [B, S] 1 on the tokens whose log-prob (value) counts, at the token's own position;
  ...             any other per-token [B, S] or per-row [B, ...] fields the loss reads (advantages,
                  old_logprobs, returns, ...); they are cut into micro-batches alongside.
Alignment: logprobs[:, t] = log p(input_ids[:, t] | input_ids[:, :t]) and entropy[:, t] is the entropy of
that same distribution; values[:, t] is the critic's value of the state just before token t (computed
from position t - 1). Position 0 has none (0), and so do padding positions.
"""

import math

import torch
import torch.distributed as dist

from distflow.config.dtypes import torch_dtype
from distflow.config.validate import offload_error
from distflow.distributed.training_world import in_training_world
from distflow.models.conversion import HFCheckpoint
from distflow.models.registry import spec_for
from distflow.models.reward_model import RewardModelCheckpoint
from distflow.workers.megatron import batching, builder, hf_io, steps
from distflow.workers.megatron.dist_checkpoint_io import load_dist_checkpoint_weights
from distflow.workers.megatron.offload import ParameterOffloader
from distflow.workers.megatron.routing_replay import RoutingReplay
from distflow.workers.megatron.value_head import install_value_head
from distflow.workers.megatron.vocab_parallel import logprobs_and_entropy, shift_to_token_positions

ROLES = ("actor", "ref", "critic", "reward")
HEADED_ROLES = ("critic", "reward")  # a scalar head replaces the vocabulary output layer


class NonFiniteLossError(RuntimeError):
    """Too many optimizer steps in a row had a NaN/Inf loss (see MegatronWorker.max_consecutive_bad_steps)."""


class MegatronWorker:
    """Builds the role's model for the layout in parallel_state and loads the HF checkpoint into it (or, with
    role_cfg.load, the Megatron dist checkpoint it names: dist_checkpoint_io.py).

    role: "actor" (trains), "ref" (forward only: no DDP, no optimizer), "critic" (value head, trains) or
    "reward" (a reward model: model_cfg.path is a *ForSequenceClassification checkpoint; forward only).
    role_cfg: the role's config section (MegatronRoleConfig; ActorConfig/CriticConfig for training roles).
    model_cfg: the `model` section (HF path, compute dtype); the critic starts from role_cfg.path if set.
    layout: the role's ParallelLayout, checked against parallel_state.
    total_optimizer_steps: optimizer steps of the whole run, for the LR schedule (training roles).
    samples_per_prompt: rows per prompt (rollout.n); mini_batch_size counts prompts.
    """

    @in_training_world
    def __init__(
        self,
        role: str,
        role_cfg,
        model_cfg,
        layout,
        device: str,
        *,
        total_optimizer_steps: int = 1,
        samples_per_prompt: int = 1,
        seed: int = 1,
    ):
        assert role in ROLES, f"role={role!r}: one of {ROLES}"
        _check_layout(role, role_cfg, layout, device)
        self.role, self.cfg, self.layout = role, role_cfg, layout
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
        )
        self.trains = role in ("actor", "critic")
        path = (getattr(role_cfg, "path", None) if role == "critic" else None) or model_cfg.path
        self.checkpoint = RewardModelCheckpoint(path) if role == "reward" else HFCheckpoint(path)
        self.spec = spec_for(self.checkpoint.config)
        self.vocab_size = self.checkpoint.config["vocab_size"]
        self.config = builder.transformer_config(
            self.spec, self.checkpoint.config, role_cfg, torch_dtype(model_cfg.dtype, "model.dtype"), device
        )
        build = builder.GPTBuildSpec(**self.spec.gpt_model_fields(self.checkpoint.config, layout.tp))
        self.chunks = builder.build_model_chunks(self.config, build, untie_output=role in HEADED_ROLES)
        if role in HEADED_ROLES and self.chunks[-1].post_process:
            install_value_head(self.chunks[-1], self.config, init_seed=seed)
            if role == "reward":
                self.chunks[-1].output_layer.weight.data.copy_(self.checkpoint.score_weight())
        self.loaded_from = None
        """The Megatron dist checkpoint folder the weights came from (role_cfg.load), or None: model.path's."""
        if getattr(role_cfg, "load", None):
            self.loaded_from = load_dist_checkpoint_weights(
                self.chunks,
                role_cfg.load,
                role,
                self.checkpoint.config,
                path,
                keep_fresh_head=role in HEADED_ROLES,
            )
        else:
            hf_io.load_hf_weights(
                self.chunks, self.spec, self.checkpoint, self.config, skip_output_layer=role in HEADED_ROLES
            )
        if self.trains:
            self.model = builder.wrap_for_training(
                self.chunks, self.config, role_cfg.optim.use_distributed_optimizer
            )
            self.optimizer, self.scheduler = builder.build_optimizer(
                role_cfg.optim, self.model, self.config, total_optimizer_steps
            )
            self.config.grad_scale_func = self.optimizer.scale_loss  # the fp16 loss scale (1 otherwise)
            assert role_cfg.mini_batch_size * samples_per_prompt % layout.dp == 0, (
                f"{role}.mini_batch_size={role_cfg.mini_batch_size} x {samples_per_prompt} samples per prompt "
                f"does not split over {layout.dp} data-parallel ranks"
            )
            self.rows_per_mini_batch = role_cfg.mini_batch_size * samples_per_prompt // layout.dp
        else:
            for chunk in self.chunks:
                chunk.requires_grad_(False)
            self.model = builder.wrap_for_inference(self.chunks, self.config)
        # actor.moe_routing_replay: the engines' routes replace the routers' own choice in every forward
        self.routing_replay = None
        if getattr(role_cfg, "moe_routing_replay", False):
            self.routing_replay = RoutingReplay(self.model, self.config)
        # ref.offload: the reference model's weights wait in CPU memory between forwards (no-op on CPU).
        self.offloader = ParameterOffloader(self.model, self.device) if role_cfg.offload else None

    # ---- forward passes -------------------------------------------------------------------------------

    @in_training_world
    @torch.no_grad()
    def compute_logprobs(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(logprobs [B, S], entropy [B, S]) float32 of this rank's rows, on every rank of the replica."""
        assert self.role != "critic", "the critic has a value head: use compute_values"

        def output_fn(local_logits, micro_batch):
            logprobs, entropy = self._logprobs(local_logits, micro_batch)
            return logprobs.sum() * 0, {"logprobs": logprobs, "entropy": entropy}

        if self.offloader is None:
            out = self._forward(batch, output_fn, ("logprobs", "entropy"))
        else:
            with self.offloader.onloaded():
                out = self._forward(batch, output_fn, ("logprobs", "entropy"))
        return out["logprobs"], out["entropy"]

    @in_training_world
    @torch.no_grad()
    def compute_values(self, batch: dict) -> torch.Tensor:
        """values [B, S] float32 of this rank's rows (critic), on every rank of the replica."""
        assert self.role == "critic", f"compute_values needs the critic's value head, not the {self.role}"

        def output_fn(output, micro_batch):
            values = self._values(output)
            return values.sum() * 0, {"values": values}

        return self._forward(batch, output_fn, ("values",))["values"]

    @in_training_world
    @torch.no_grad()
    def compute_scores(self, batch: dict) -> torch.Tensor:
        """scores [B] float32 of this rank's rows (reward model): the head at each row's last real token,
        as transformers' *ForSequenceClassification pools it; on every rank of the replica."""
        assert self.role == "reward", f"compute_scores needs a reward model, not the {self.role}"

        def output_fn(output, micro_batch):
            heads = output[..., 0].float()  # unshifted: the head at position t read tokens 0..t
            return heads.sum() * 0, {"heads": heads}

        heads = self._forward(batch, output_fn, ("heads",))["heads"]
        last = batch["attention_mask"].sum(dim=1).long() - 1
        return heads[torch.arange(len(last)), last.to(heads.device)]

    def _forward(self, batch: dict, output_fn, names: tuple) -> dict:
        from megatron.core import parallel_state as ps

        for chunk in self.model:
            chunk.eval()
        caller_device = batch["input_ids"].device
        batch = self._to_device(batch)
        groups, micro_batches = self._micro_batches(batch)
        payloads = self._run_schedule(micro_batches, forward_only=True, output_fn=output_fn)
        rows, seq = batch["input_ids"].shape
        result = torch.zeros(len(names), rows, seq, dtype=torch.float32, device=self.device)
        if ps.is_pipeline_last_stage():
            for i, name in enumerate(names):
                result[i] = batching.scatter_rows([p[name] for p in payloads], groups, rows, seq)
            result *= batch["attention_mask"].to(result.dtype)
        if ps.get_pipeline_model_parallel_world_size() > 1:  # every stage of the replica returns the result
            dist.broadcast(
                result,
                src=ps.get_pipeline_model_parallel_last_rank(),
                group=ps.get_pipeline_model_parallel_group(),
            )
        return dict(zip(names, result.to(caller_device)))

    def _run_schedule(self, micro_batches: list[dict], forward_only: bool, output_fn) -> list:
        if self.routing_replay is None:
            return steps.run_schedule(self.model, micro_batches, forward_only, output_fn)
        try:
            return steps.run_schedule(
                self.model, micro_batches, forward_only, output_fn, self.routing_replay.before_forward
            )
        finally:
            self.routing_replay.finish()

    def _to_device(self, batch: dict) -> dict:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    # ---- training -------------------------------------------------------------------------------------

    @in_training_world
    def train_step(self, batch: dict, loss_fn) -> dict:
        """ppo_epochs passes over the batch, one optimizer step per mini-batch; returns averaged metrics.

        loss_fn(logprobs, entropy, micro_batch) -> (loss, metrics) for the actor, loss_fn(values,
        micro_batch) for the critic; it runs on the last pipeline stage with one micro-batch's [rows, len]
        tensors (its own fields, trimmed). Convention: loss is the token-mean over the micro-batch's
        response tokens (e.g. algorithms.policy_loss with loss_agg_mode="token-mean"), and so is each
        metric. The worker weights micro-batch i by n_i / N (n_i its response tokens, N those of the whole
        mini-batch over all data-parallel ranks), so the gradient is that of the token-mean loss over the
        mini-batch, whatever its split into micro-batches and DP ranks. Modes that are not a token-mean
        (seq-mean-*) are weighted the same way, i.e. approximated per micro-batch.

        Returns: each loss_fn metric and "loss" (token-weighted over each mini-batch, then averaged over
        optimizer steps), "grad_norm" (before clipping, averaged over steps), "lr" (of the last step),
        "optimizer_steps", "skipped_steps" (NaN/Inf loss or gradients), "nan_loss" (steps with a NaN/Inf loss),
        "nan_grad" (a finite loss but NaN/Inf gradients): both skipped, max_consecutive_bad_steps of them in a
        row raise NonFiniteLossError; "micro_batches".
        """
        assert self.trains, "the reference model is forward-only"
        batch = self._to_device(batch)
        rows = batch["input_ids"].shape[0]
        _check_same_rows_on_dp_ranks(rows, self.device)
        per_step = []
        for _ in range(self.cfg.ppo_epochs):
            for rows_of_step in batching.mini_batch_ranges(rows, self.rows_per_mini_batch):
                per_step.append(self._optimizer_step(batching.select_rows(batch, rows_of_step), loss_fn))
        return _average_steps(per_step)

    def _optimizer_step(self, mini_batch: dict, loss_fn) -> dict:
        from megatron.core import parallel_state as ps

        for chunk in self.model:
            chunk.train()
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        groups, micro_batches = self._micro_batches(mini_batch)
        total_tokens = mini_batch["response_mask"].sum().to(torch.float64).reshape(1)
        dist.all_reduce(total_tokens, group=ps.get_data_parallel_group())
        total_tokens = total_tokens.clamp(min=1).item()
        # Megatron divides each micro-batch loss by the micro-batch count and DDP averages over DP ranks.
        scale = len(micro_batches) * ps.get_data_parallel_world_size() / total_tokens

        def output_fn(output, micro_batch):
            if self.role == "critic":
                loss, metrics = loss_fn(self._values(output), micro_batch)
            else:
                loss, metrics = loss_fn(*self._logprobs(output, micro_batch), micro_batch)
            tokens = micro_batch["response_mask"].sum().to(torch.float32)
            weight = tokens / total_tokens
            payload = {  # token-weighted, to be summed; a maximum (name ending in _max) stays as it is
                k: torch.as_tensor(v, dtype=torch.float32, device=weight.device).detach()
                * (1.0 if _is_max(k) else weight)
                for k, v in metrics.items()
            }
            payload["loss"] = loss.detach().float() * weight
            return loss * (tokens * scale), payload

        payloads = self._run_schedule(micro_batches, forward_only=False, output_fn=output_fn)
        lr = self.optimizer.param_groups[0]["lr"]
        metrics = _reduce_loss_metrics(payloads)  # the same on every rank of the role
        # A NaN/Inf loss, or NaN/Inf gradients under a finite loss (an fp32/bf16 optimizer has no loss scaler
        # to catch them), would write NaN into the weights: skip the update (parameters, Adam state and LR
        # schedule stay).
        finite_loss = math.isfinite(metrics["loss"])
        finite_grads = finite_loss and _gradients_finite(self.model, self.device)
        ok, grad_norm, _ = self.optimizer.step() if finite_grads else (False, float("nan"), None)
        if ok:
            self.scheduler.step(increment=1)
        self._check_bad_steps(finite_grads)
        metrics.update(
            grad_norm=float(grad_norm or 0.0),
            lr=lr,
            skipped_steps=float(not ok),
            nan_loss=float(not finite_loss),
            nan_grad=float(finite_loss and not finite_grads),
            micro_batches=float(len(micro_batches)),
        )
        return metrics

    max_consecutive_bad_steps = 3  # the trainer sets trainer.max_consecutive_bad_steps
    _bad_steps_in_a_row = 0

    def _check_bad_steps(self, finite: bool) -> None:
        self._bad_steps_in_a_row = 0 if finite else self._bad_steps_in_a_row + 1
        if self._bad_steps_in_a_row >= self.max_consecutive_bad_steps:
            raise NonFiniteLossError(
                f"{self.role}: the loss or the gradients were NaN/Inf in {self._bad_steps_in_a_row} optimizer steps "
                f"in a row (each update skipped); stopping (trainer.max_consecutive_bad_steps={self.max_consecutive_bad_steps}). "
                "Check the learning rate, the data and the loss inputs (advantages, log-probs) of these steps"
            )

    # ---- pieces ---------------------------------------------------------------------------------------

    def _micro_batches(self, batch: dict) -> tuple[list[list[int]], list[dict]]:
        lengths = batching.sequence_lengths(batch["attention_mask"])
        # The interleaved schedule needs a multiple of pp micro-batches.
        multiple = self.layout.pp if len(self.chunks) > 1 else 1
        groups = batching.row_groups(lengths, self.cfg, multiple)
        # Sequence parallelism splits the sequence over TP ranks.
        pad = self.layout.tp if self.config.sequence_parallel else 1
        # Without a shape exchange between pipeline stages, every micro-batch has the same shape.
        uniform = self.layout.pp > 1 and not self.config.variable_seq_lengths
        shape = batching.uniform_shape(groups, lengths, pad) if uniform else None
        return groups, [batching.micro_batch(batch, g, lengths, pad, shape) for g in groups]

    def _logprobs(self, local_logits: torch.Tensor, micro_batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = micro_batch["input_ids"]
        next_tokens = torch.cat([tokens[:, 1:], torch.zeros_like(tokens[:, :1])], dim=1)
        logprobs, entropy = logprobs_and_entropy(local_logits, next_tokens, self.vocab_size)
        return shift_to_token_positions(logprobs), shift_to_token_positions(entropy)

    @staticmethod
    def _values(output: torch.Tensor) -> torch.Tensor:
        return shift_to_token_positions(output[..., 0].float())

    @in_training_world
    def export_hf_state(self) -> dict[str, torch.Tensor] | None:
        """The model's weights under HF names on global rank 0 (None elsewhere); the critic's without its head."""
        return hf_io.gather_hf_state(
            self.chunks,
            self.spec,
            self.checkpoint.config,
            self.config,
            skip_output_layer=self.role == "critic",
        )

    @in_training_world
    def gather_hf_grads(self) -> dict[str, torch.Tensor] | None:
        """The last step's gradients under HF names on global rank 0 (for tests and debugging)."""
        return hf_io.gather_hf_state(
            self.chunks,
            self.spec,
            self.checkpoint.config,
            self.config,
            tensors="grads",
            skip_output_layer=self.role == "critic",
        )


def _check_layout(role: str, role_cfg, layout, device: str) -> None:
    from megatron.core import parallel_state as ps

    actual = dict(
        tp=ps.get_tensor_model_parallel_world_size(),
        pp=ps.get_pipeline_model_parallel_world_size(),
        dp=ps.get_data_parallel_world_size(),
        cp=ps.get_context_parallel_world_size(),
        vpp=ps.get_virtual_pipeline_model_parallel_world_size() or 1,
        ep=ps.get_expert_model_parallel_world_size(),
        etp=ps.get_expert_tensor_parallel_world_size(),
    )
    wanted = {k: getattr(layout, k) for k in actual}
    if actual != wanted:
        raise RuntimeError(
            f"{role}: Megatron's process groups are {actual} but the role's layout is {wanted}; "
            "initialise them for this layout first (distflow.distributed.initialize_megatron_groups)"
        )
    if layout.cp > 1:
        where = "on CPU (no Transformer Engine, no CUDA)" if device == "cpu" else "yet"
        raise ValueError(
            f"{role}.cp={layout.cp}: context parallelism needs Transformer Engine's attention on CUDA "
            f"and a CP split of every batch, which the Megatron worker does not do {where}; set "
            f"{role}.cp=1"
        )

    error = offload_error(role, role_cfg)
    if error:
        raise ValueError(error)


def _gradients_finite(ddp_chunks: list, device: torch.device) -> bool:
    """Whether every gradient of the role is finite, on every rank (one small all_reduce over the role's ranks:
    with the distributed optimizer each rank holds reduced gradients for its own shard only, and a NaN in any
    rank's local gradients reaches some shard). Reads Megatron DDP's flat gradient buffers."""
    bad = torch.zeros(1, device=device)
    for chunk in ddp_chunks:
        for buffer in chunk.buffers + chunk.expert_parallel_buffers:
            bad += (~torch.isfinite(buffer.grad_data)).any()  # stays on the device: one sync below
    dist.all_reduce(bad, op=dist.ReduceOp.MAX)  # the training ranks' world (training_world)
    return not bool(bad.item())


def _check_same_rows_on_dp_ranks(rows: int, device: torch.device) -> None:
    """Every DP rank must run the same number of optimizer steps (each one all-reduces gradients)."""
    from megatron.core import parallel_state as ps

    if ps.get_data_parallel_world_size() == 1:
        return
    bounds = torch.tensor([rows, -rows], dtype=torch.int64, device=device)
    dist.all_reduce(bounds, op=dist.ReduceOp.MAX, group=ps.get_data_parallel_group())
    if bounds[0] != -bounds[1]:
        raise ValueError(
            f"data-parallel ranks hold between {-bounds[1].item()} and {bounds[0].item()} rows; "
            "train_step needs the same number on each (balance the batch before training)"
        )


def _is_max(name: str) -> bool:
    """A metric that is a maximum (e.g. rollout_corr/logprob_abs_diff_max): reduced by max, not summed."""
    return name.endswith("_max")


def _reduce_loss_metrics(payloads: list[dict]) -> dict:
    """Sum of the token-weighted micro-batch metrics over micro-batches and DP ranks (the max of the
    maxima), on every rank."""
    from megatron.core import parallel_state as ps

    summed = [None]
    if ps.is_pipeline_last_stage():
        names = sorted(k for k in payloads[0] if not _is_max(k))
        maxima = sorted(k for k in payloads[0] if _is_max(k))
        local = torch.stack([sum(p[k] for p in payloads) for k in names]).to(torch.float64)
        dist.all_reduce(local, group=ps.get_data_parallel_group())
        summed = [dict(zip(names, local.tolist()))]
        if maxima:
            peak = torch.stack([torch.stack([p[k] for p in payloads]).max() for k in maxima]).double()
            dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=ps.get_data_parallel_group())
            summed[0].update(zip(maxima, peak.tolist()))
    if ps.get_pipeline_model_parallel_world_size() > 1:
        dist.broadcast_object_list(
            summed,
            src=ps.get_pipeline_model_parallel_last_rank(),
            group=ps.get_pipeline_model_parallel_group(),
        )
    return summed[0]


def _average_steps(per_step: list[dict]) -> dict:
    out = {
        k: max(m[k] for m in per_step) if _is_max(k) else sum(m[k] for m in per_step) / len(per_step)
        for k in per_step[0]
    }
    out.update(
        lr=per_step[-1]["lr"],
        optimizer_steps=float(len(per_step)),
        **{
            k: sum(m[k] for m in per_step) for k in ("skipped_steps", "nan_loss", "nan_grad", "micro_batches")
        },
    )
    return out
