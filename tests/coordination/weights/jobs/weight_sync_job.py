"""torchrun job (2 ranks, colocated): one SGLang engine owned by rank 0, Megatron trained in several layouts,
the weights pushed into the engine by the WeightResharder after each training step.

    torchrun --nproc-per-node 2 weight_sync_job.py MODEL_DIR OUT_DIR ENGINE_TP CASE [CASE ...]

CASE is a Megatron layout `tp=2`, `pp=2`, `tp=1` (dp 2), `ep=2` (MoE), optionally followed by `+extras` where extras are
`,`-separated among: counted (load with the counting loader and report bytes per engine rank), hf (also
sync through the HF-named fallback), nogen (the engine cannot generate, e.g. SGLang's Qwen2-MoE on CPU:
train on fixed tokens and compare engine parameters only), fault (a rank fails mid-sync), corrupt (an
engine parameter is overwritten during a sync: verify must name it), kill (kill an engine process mid-sync;
last case only).
After fault/corrupt a good sync follows. For each case rank 0 appends one JSON line to OUT_DIR/results.jsonl
(and prints it after `RESULT `):
  sync: the SyncStats; engine_vs_megatron: mean |engine log-prob - Megatron log-prob| of the engine's
  greedy tokens; disk_equal: the engine's greedy tokens and log-probs after update_weights_from_disk of the
  exported HF checkpoint equal those after the sync; disk_params_equal (hf_params_equal): every engine
  parameter's checksum after that load (after the HF-named fallback sync) equals its checksum after the
  sync; plus what the extras measured.
With ENGINE_TP 1 the engine is one rank's (rank 0); with 2 it spans both ranks.
"""

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [20, 30, 40, 50]]
NEW_TOKENS = 8
SMALL_BUCKET = 16384  # bytes: many buckets, so faults land mid-sync
FIXED_TOKENS = [3, 4, 5, 6]  # `nogen`: the continuation trained on (the engine cannot generate)


def main():
    model_dir, out_dir, engine_tp, cases = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    from distflow import distributed
    from distflow.coordination.weights import engine_side
    from distflow.workers.rollout import start_engine

    distributed.init_process_group("cpu", timeout_s=600)
    torch.set_num_threads(1)
    rank = dist.get_rank()
    engine = None
    if rank == 0:
        engine = start_engine(
            model_dir, tp=engine_tp, seed=0, extra_args=engine_side.engine_args(), startup_timeout_s=600
        )
    dist.barrier()
    for case in cases:
        result = run_case(case, model_dir, out_dir, engine, engine_tp)
        if rank == 0:
            line = json.dumps(result)
            with open(os.path.join(out_dir, "results.jsonl"), "a") as f:
                f.write(line + "\n")
            print("RESULT " + line, flush=True)
    if engine is not None:
        from distflow.workers.rollout import shutdown_engine

        shutdown_engine(engine)
    dist.barrier()
    print(f"RANK-DONE {rank}", flush=True)
    dist.destroy_process_group()


def placement_for(engine_tp: int):
    from distflow.layout import Placement

    if engine_tp == 2:
        return Placement.create("colocated", 2, 2)
    # One engine on rank 0 only (a second engine on rank 1 would double the test's start-up cost).
    return Placement(kind="colocated", world_size=2, train_ranks=(0, 1), rollout_ranks=(0,), engine_tp=1)


def make_actor(model_dir, tp, pp, ep):
    from distflow import distributed
    from distflow.config.schema import ActorConfig, ModelConfig, OptimizerConfig
    from distflow.layout import ParallelLayout, Placement
    from distflow.workers.megatron.worker import MegatronWorker

    layout = ParallelLayout.for_world(2, tp=tp, pp=pp, ep=ep)
    distributed.initialize_megatron_groups(layout, Placement.create("colocated", 2, 1), timeout_s=600)
    distributed.seed_everything(1)
    optim = OptimizerConfig(lr=2e-2, weight_decay=0.0, clip_grad=0.0, use_distributed_optimizer=False)
    cfg = ActorConfig(tp=tp, pp=pp, ep=ep, optim=optim, max_tokens_per_micro_batch=256)
    return MegatronWorker("actor", cfg, ModelConfig(path=model_dir, dtype="float32"), layout, "cpu")


def batch_of(sequences, prompt_lens):
    width = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    response = torch.zeros_like(ids)
    for i, (seq, p) in enumerate(zip(sequences, prompt_lens)):
        ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = 1
        response[i, p : len(seq)] = 1
    return {"input_ids": ids, "attention_mask": attention, "response_mask": response}


def likelihood_loss(logprobs, entropy, micro_batch):
    mask = micro_batch["response_mask"].float()
    loss = -(logprobs * mask).sum() / mask.sum().clamp(min=1)
    return loss, {}


def greedy(engine):
    from distflow.workers.rollout import generate, state_of

    state_of(engine).require_fresh()  # before touching an engine that may be dead
    engine.flush_cache()
    samples = generate(engine, PROMPTS, temperature=0.0, max_new_tokens=NEW_TOKENS)
    versions = {s.weight_version for s in samples}
    assert len(versions) == 1, versions
    return versions.pop(), [(s.response_ids, s.logprobs) for s in samples]


def broadcast(obj):
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def local_digest(tensors):
    from distflow.coordination.weights.checksum import checksum

    return {n: checksum(t) for n, t in tensors.items()}


def run_case(case, model_dir, out_dir, engine, engine_tp):
    from distflow.config.schema import SyncConfig
    from distflow.coordination.weights import (
        StaleEngineError,
        WeightResharder,
        WeightSyncError,
        engine_side,
        megatron_tensors,
        plan_weight_sync,
    )
    from distflow.workers.megatron.hf_io import save_hf_checkpoint
    from distflow.workers.rollout import state_of, update_weights_from_disk

    layout_text, _, extras_text = case.partition("+")
    sizes = dict(tp=1, pp=1, ep=1)
    sizes.update({k: int(v) for k, v in (kv.split("=") for kv in layout_text.split(",") if kv)})
    extras = set(filter(None, extras_text.split(",")))
    rank = dist.get_rank()
    placement = placement_for(engine_tp)
    worker = make_actor(model_dir, sizes["tp"], sizes["pp"], sizes["ep"])
    result = {"case": case}

    # Train one step on the engine's own greedy continuations, so the weights differ from the checkpoint's.
    nogen = "nogen" in extras
    before_training = greedy(engine)[1] if rank == 0 and not nogen else None
    sequences = (
        [p + FIXED_TOKENS for p in PROMPTS]
        if nogen
        else broadcast([p + s[0] for p, s in zip(PROMPTS, before_training)] if rank == 0 else None)
    )
    batch = batch_of(sequences, [len(p) for p in PROMPTS])
    worker.train_step(batch, likelihood_loss)
    local = megatron_tensors(worker.chunks, worker.config)

    plan = plan_weight_sync(
        worker.spec,
        worker.checkpoint.config,
        worker.layout,
        placement,
        bucket_bytes=SMALL_BUCKET,
        element_size=4,
        padded_vocab=worker.chunks[0].vocab_size,
        engine_device="cpu",
    )
    load_format = engine_side.LOAD_COUNTED if "counted" in extras else "direct"
    resharder = WeightResharder(plan, local, engine=engine, verify=True, load_format=load_format)
    before_params = param_checksums(resharder.probe_engine(checksums=True)) if rank == 0 and nogen else None

    if (
        "fault" in extras
    ):  # rank 1 fails in bucket 2: every rank raises, the engine is stale, Megatron untouched
        before = local_digest(local)

        def fail(b):
            if b == 2 and rank == 1:
                raise OSError("injected failure while writing bucket 2")

        resharder.on_bucket = fail
        try:
            resharder.sync()
            result["fault_raised"] = None
        except WeightSyncError as exc:
            result["fault_raised"] = str(exc)
        resharder.on_bucket = None
        result["megatron_intact"] = all(dist_all(local_digest(local) == before))
        if rank == 0:
            from distflow.workers.rollout import generate

            try:  # the engine is alive but half-updated: generate itself must refuse it
                generate(engine, PROMPTS, temperature=0.0, max_new_tokens=NEW_TOKENS)
                result["stale_refused"] = None
            except StaleEngineError as exc:
                result["stale_refused"] = str(exc)

    if "corrupt" in extras:  # an engine parameter changes behind the sync's back: verify names it

        def corrupt(b):
            if b == len(plan.buckets) - 1 and rank == 0:
                name = "model.layers.0.mlp.down_proj.weight"
                shape = plan.engines[0][0].param_shapes[name]
                engine.update_weights_from_tensor([(name, torch.ones(shape))], load_format="direct")

        resharder.on_bucket = corrupt
        try:
            resharder.sync()
            result["corrupt_raised"] = None
        except WeightSyncError as exc:
            result["corrupt_raised"] = str(exc)
        resharder.on_bucket = None

    if "kill" in extras:
        return run_kill(resharder, engine, local, result)

    stats = resharder.sync()
    result["sync"] = dict(
        version=stats.version,
        seconds=stats.seconds,
        total_bytes=stats.total_bytes,
        busiest_sender_bytes=stats.busiest_sender_bytes,
        buckets=stats.buckets,
        receiver_bytes={f"{e}/{r}": b for (e, r), b in stats.receiver_bytes.items()},
        metrics=stats.metrics(),
        sender_bytes=plan.sender_bytes(),
        mode=plan.mode,
        hf_receiver_bytes=plan_weight_sync(  # what the HF-named fallback would stage, for reports
            worker.spec,
            worker.checkpoint.config,
            worker.layout,
            placement,
            bucket_bytes=SMALL_BUCKET,
            element_size=4,
            padded_vocab=worker.chunks[0].vocab_size,
            mode="hf",
        ).receiver_bytes(0, 0),
    )
    if rank == 0:
        synced_params = param_checksums(resharder.last_engine_reports)
        if nogen:
            result["version"], synced = state_of(engine).version, None
            result["changed_by_training"] = synced_params != before_params
        else:
            result["version"], synced = greedy(engine)
            result["changed_by_training"] = synced != before_training
        if "counted" in extras:
            reports = resharder.last_engine_reports
            result["counted"] = [
                dict(
                    received=rep["received_bytes"],
                    tensors=rep["received_tensors"],
                    params=sum(_numel(p["shape"]) * 4 for p in rep["params"].values()),
                    errors=rep["errors"],
                )
                for rep in reports
            ]
    if not nogen:
        tokens = broadcast([s[0] for s in synced] if rank == 0 else None)
        megatron_lp, _ = worker.compute_logprobs(
            batch_of([p + t for p, t in zip(PROMPTS, tokens)], [len(p) for p in PROMPTS])
        )
    if "hf" in extras:  # the fallback through HF names and SGLang's own loader, same weights
        fallback = WeightResharder.for_megatron_worker(
            worker, placement, SyncConfig(bucket_mb=1, verify=True), engine=engine, mode="hf"
        )
        fallback.sync()
        if rank == 0:
            result["hf_params_equal"] = param_checksums(fallback.last_engine_reports) == synced_params
            if not nogen:
                result["hf_equal"] = greedy(engine)[1] == synced
    exported = worker.export_hf_state()
    if rank == 0:
        path = os.path.join(out_dir, f"export-{case.replace('=', '').replace(',', '_').replace('+', '_')}")
        save_hf_checkpoint(exported, model_dir, path)
        update_weights_from_disk(engine, path)
        result["disk_params_equal"] = param_checksums(resharder.probe_engine(checksums=True)) == synced_params
        if not nogen:
            diffs = [
                abs(lp - megatron_lp[i, len(p) + j].item())
                for i, (p, (_, lps)) in enumerate(zip(PROMPTS, synced))
                for j, lp in enumerate(lps)
            ]
            result["engine_vs_megatron"] = sum(diffs) / len(diffs)
            result["disk_equal"] = greedy(engine)[1] == synced
            result["greedy"] = synced
    dist.barrier()
    return result


def run_kill(resharder, engine, local, result):
    """Kill the engine's scheduler while bucket 1 is written: a clear error on every rank, quickly."""
    import psutil

    from distflow.coordination.weights import StaleEngineError, WeightSyncError

    rank = dist.get_rank()
    before = local_digest(local)

    def kill(b):
        if b == 1 and rank == 0:
            for pid in engine.get_all_child_pids():
                for proc in [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True):
                    if "scheduler" in " ".join(proc.cmdline()).lower() or "sglang::scheduler" in proc.name():
                        proc.send_signal(signal.SIGKILL)

    resharder.on_bucket = kill
    tic = time.perf_counter()
    try:
        resharder.sync()
        result["kill_raised"] = None
    except WeightSyncError as exc:
        result["kill_raised"] = str(exc)
    result["kill_seconds"] = time.perf_counter() - tic
    result["megatron_intact"] = all(dist_all(local_digest(local) == before))
    if rank == 0:
        try:
            greedy(engine)
            result["stale_refused"] = None
        except StaleEngineError as exc:
            result["stale_refused"] = str(exc)
    dist.barrier()
    return result


def param_checksums(reports) -> list[dict]:
    """Per engine rank: parameter name -> checksum (from engine_side.probe reports with checksums)."""
    return [{n: p["checksum"] for n, p in rep["params"].items()} for rep in reports]


def dist_all(flag: bool) -> list[bool]:
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, bool(flag))
    return out


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


if __name__ == "__main__":
    main()
