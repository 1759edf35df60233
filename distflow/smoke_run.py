"""The `smoke` pipeline: the framework's pieces end to end on a tiny model, with numbers to check.

Every rank: build the actor's MegatronWorker (the HF model loaded into Megatron-Core in the actor's layout,
each rank reading only its slices), train a few supervised steps on a copy task ("1234>" -> "1234<eos>")
through MegatronWorker.train_step, export the trained weights to
Hugging Face safetensors. Rank 0 then starts the real SGLang engine on the export and samples; every rank
recomputes the samples' log-probs with Megatron, and rank 0 prints the engine-vs-Megatron difference
(the check that training, export and the engine agree on the same weights).
Writes <trainer.output_dir>/smoke_summary.json and <trainer.output_dir>/hf/.
"""

import json
import random
import time
from pathlib import Path

import torch
import torch.distributed as dist

from distflow.algorithms.aggregation import masked_mean
from distflow.workers.megatron import hf_io
from distflow.workers.megatron.worker import MegatronWorker
from distflow.workers.rollout import sglang_engine

COPY_DIGITS = 4


def copy_task_batch(tokenizer, count: int, seed: int) -> dict:
    """`count` copy-task sequences as one right-padded worker batch (MegatronWorker's format): input_ids,
    attention_mask, and response_mask on the answer tokens (at each token's own position)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        digits = "".join(rng.choice("0123456789") for _ in range(COPY_DIGITS))
        prompt = tokenizer.encode(f"{digits}>", add_special_tokens=False)
        answer = tokenizer.encode(digits, add_special_tokens=False) + [tokenizer.eos_token_id]
        rows.append((prompt, answer))
    return _worker_batch(rows, tokenizer.pad_token_id)


def _worker_batch(rows: list[tuple[list[int], list[int]]], pad_id: int) -> dict:
    """(prompt ids, response ids) pairs -> input_ids, attention_mask, response_mask [rows, longest]."""
    length = max(len(p) + len(r) for p, r in rows)
    input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), length), dtype=torch.long)
    response_mask = torch.zeros((len(rows), length), dtype=torch.float32)
    for i, (prompt, response) in enumerate(rows):
        input_ids[i, : len(prompt) + len(response)] = torch.tensor(prompt + response)
        attention_mask[i, : len(prompt) + len(response)] = 1
        response_mask[i, len(prompt) : len(prompt) + len(response)] = 1.0
    return {"input_ids": input_ids, "attention_mask": attention_mask, "response_mask": response_mask}


def answer_nll(logprobs, entropy, micro_batch):
    """Supervised loss for MegatronWorker.train_step: token-mean negative log-likelihood of the answers."""
    return -masked_mean(logprobs, micro_batch["response_mask"]), {}


def copy_task_prompts(tokenizer, count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        tokenizer.encode(
            "".join(rng.choice("0123456789") for _ in range(COPY_DIGITS)) + ">", add_special_tokens=False
        )
        for _ in range(count)
    ]


def _data_parallel_rows(batch: dict) -> dict:
    from megatron.core import parallel_state as ps

    dp, rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    return {k: v.chunk(dp, dim=0)[rank] for k, v in batch.items()}


def run(ctx) -> None:
    from transformers import AutoTokenizer  # noqa: PLC0415 - transformers is heavy: imported once the smoke run starts

    cfg, layout = ctx.cfg, ctx.cluster.actor
    out_dir = Path(cfg.trainer.output_dir)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path or cfg.model.path)

    t0 = time.perf_counter()
    # One optimizer step per train_step (actor.mini_batch_size=0: the whole batch, ppo_epochs=1).
    worker = MegatronWorker(
        "actor",
        cfg.actor,
        cfg.model,
        layout,
        ctx.device,
        total_optimizer_steps=cfg.trainer.total_steps * cfg.actor.ppo_epochs,
        seed=cfg.trainer.seed,
    )
    ctx.log(
        f"{worker.spec.family} model loaded from {cfg.model.path} into Megatron ({layout.describe()}) "
        f"in {time.perf_counter() - t0:.1f} s"
    )

    losses = []
    for step in range(1, cfg.trainer.total_steps + 1):
        t = time.perf_counter()
        # 16 fresh rows per DP rank per step (every rank draws the same rows, then keeps its DP share).
        batch = _data_parallel_rows(
            copy_task_batch(tokenizer, 16 * layout.dp, cfg.trainer.seed * 7919 + 2 * step)
        )
        metrics = worker.train_step(batch, answer_nll)
        losses.append(metrics["loss"])
        ctx.log(
            f"train step {step}/{cfg.trainer.total_steps}: loss {metrics['loss']:.4f} "
            f"grad_norm {metrics['grad_norm']:.3f} lr {metrics['lr']:.2e} ({time.perf_counter() - t:.2f} s)"
        )

    t = time.perf_counter()
    hf_state = worker.export_hf_state()
    export_dir = out_dir / "hf"
    if ctx.rank == 0:
        hf_io.save_hf_checkpoint(hf_state, cfg.model.path, export_dir)
        ctx.log(f"exported {len(hf_state)} tensors to {export_dir} in {time.perf_counter() - t:.1f} s")
    dist.barrier()

    samples = _generate_on_rank0(ctx, export_dir, tokenizer)
    diffs = _compare_logprobs(worker, samples, tokenizer.pad_token_id)
    if ctx.rank == 0:
        summary = {
            "family": worker.spec.family,
            "layout": layout.describe(),
            "losses": losses,
            "samples": [{"prompt": s["prompt_text"], "response": s["response_text"]} for s in samples],
            "engine_vs_megatron_logprob_mean_abs_diff": diffs["mean"],
            "engine_vs_megatron_logprob_max_abs_diff": diffs["max"],
        }
        copied = sum(s["response_text"] == s["prompt_text"][:-1] + tokenizer.eos_token for s in samples)
        summary["heldout_copy_exact_match"] = copied / len(samples)
        (out_dir / "smoke_summary.json").write_text(json.dumps(summary, indent=2))
        ctx.log(
            f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps; engine vs Megatron "
            f"log-probs on the sampled tokens: mean |diff| {diffs['mean']:.2e}, max {diffs['max']:.2e}"
        )
        ctx.log(f"held-out prompts copied exactly: {copied}/{len(samples)}")
        ctx.log(f"summary: {out_dir / 'smoke_summary.json'}")


def _generate_on_rank0(ctx, export_dir: Path, tokenizer) -> list[dict]:
    """Rank 0's engine samples (a smoke run needs one engine); every rank receives the samples."""
    cfg = ctx.cfg
    payload = [None]
    if ctx.rank == 0:
        t = time.perf_counter()
        engine = sglang_engine.start_engine(
            export_dir,
            tp=ctx.cluster.placement.engine_tp,
            dtype=cfg.rollout.dtype or cfg.model.dtype,
            seed=cfg.trainer.seed,
            extra_args=cfg.rollout.sglang,
        )
        ctx.log(f"SGLang engine started on {export_dir} in {time.perf_counter() - t:.1f} s")
        try:
            prompts = copy_task_prompts(tokenizer, 8, seed=cfg.trainer.seed + 1000)  # never trained on
            t = time.perf_counter()
            outs = sglang_engine.generate(
                engine,
                prompts,
                n=cfg.rollout.n,
                temperature=cfg.rollout.temperature,
                max_new_tokens=cfg.rollout.max_new_tokens,
                stop_token_ids=[tokenizer.eos_token_id],
            )
            ctx.log(f"generated {len(outs)} samples in {time.perf_counter() - t:.2f} s")
        finally:
            sglang_engine.shutdown_engine(engine)
        samples = []
        for s in outs:
            prompt = prompts[s.prompt_index]
            samples.append(
                {
                    "prompt_ids": prompt,
                    "response_ids": s.response_ids,
                    "logprobs": s.logprobs,
                    "prompt_text": tokenizer.decode(prompt),
                    "response_text": tokenizer.decode(s.response_ids),
                }
            )
            ctx.log(
                f"  {samples[-1]['prompt_text']!r} -> {samples[-1]['response_text']!r} ({s.finish_reason})"
            )
        payload = [samples]
    dist.broadcast_object_list(payload, src=0)
    return payload[0]


def _compare_logprobs(worker, samples: list[dict], pad_id: int) -> dict:
    """Megatron's log-probs of each sampled response vs the engine's (same weights, so they must agree)."""
    batch = _worker_batch([(s["prompt_ids"], s["response_ids"]) for s in samples], pad_id)
    logprobs, _ = worker.compute_logprobs(batch)  # every rank of the replica gets them
    per_token = []
    for i, s in enumerate(samples):
        start = len(s["prompt_ids"])  # log-probs sit at the position of the token they score
        ours = logprobs[i, start : start + len(s["response_ids"])]
        per_token.append((ours - torch.tensor(s["logprobs"])).abs())
    all_diffs = torch.cat(per_token)
    return {"mean": all_diffs.mean().item(), "max": all_diffs.max().item()}
