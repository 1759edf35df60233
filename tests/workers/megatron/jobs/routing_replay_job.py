"""torchrun job (2 ranks): MoE routing replay between a real SGLang engine and real Megatron-Core.

    torchrun --nproc-per-node 2 routing_replay_job.py MODEL_DIR OUT_DIR EPS LAYOUT [LAYOUT ...]

The router of MODEL_DIR is first made near-tied, as routers are where engine and trainer disagree: in every
layer's gate, expert 1's row becomes expert 0's plus EPS x a fixed random direction u (rank 0 rewrites the
checkpoint). Rank 0 starts one engine on it with enable_return_routed_experts and nudges the engine's gates
only: expert 1's row becomes expert 0's minus EPS x u (update_weights_from_tensors). Wherever one of experts
0 and 1 makes a token's top-k, the engine picks the other one than Megatron's router (same checkpoint, not
nudged) would, while every router score moves by only ~EPS. It samples, and every rank gets the samples
with their routes. For each LAYOUT (`tp=2`, `ep=2`, ...) an actor with actor.moe_routing_replay=true is
built from MODEL_DIR and computes the samples' log-probs twice, through pack_samples and to_padded as a run
does: with the routes replayed, and with its own routing (the replay switched off). Forward hooks on its
routers record the experts each token went to. Rank 0 appends one JSON line per layout to
OUT_DIR/results.jsonl:
  tokens: the tokens compared (every token but each sample's last, which the engine never fed back);
  replayed_mismatches / own_mismatches: tokens x layers whose experts (as sets) differ from the engine's;
  replayed_gap / own_gap: max |engine log-prob - Megatron log-prob| over the response tokens.
"""

import json
import os
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [20, 30, 40, 50], [7, 7, 8, 9, 100, 101, 102]]
SAMPLES_PER_PROMPT = 3
NEW_TOKENS = 10


def main():
    model_dir, out_dir, eps, layouts = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
    from distflow import distributed
    from distflow.workers.rollout import generate, shutdown_engine, start_engine, update_weights_from_tensors

    distributed.init_process_group("cpu", timeout_s=600)
    torch.set_num_threads(1)
    samples = None
    if dist.get_rank() == 0:
        gates = near_tied_gates(model_dir, eps)
        engine = start_engine(
            model_dir, seed=0, extra_args={"enable_return_routed_experts": True}, startup_timeout_s=600
        )
        update_weights_from_tensors(engine, [(name, flip(w)) for name, (w, flip) in gates.items()])
        samples = generate(engine, PROMPTS, n=SAMPLES_PER_PROMPT, max_new_tokens=NEW_TOKENS, seed=1)
        shutdown_engine(engine)
    box = [samples]
    dist.broadcast_object_list(box, src=0)  # also: the checkpoint is rewritten
    for layout in layouts:
        result = run_layout(model_dir, layout, box[0])
        if dist.get_rank() == 0:
            with open(os.path.join(out_dir, "results.jsonl"), "a") as f:
                f.write(json.dumps(result) + "\n")
            print("RESULT " + json.dumps(result), flush=True)
    dist.barrier()
    print(f"RANK-DONE {dist.get_rank()}", flush=True)
    dist.destroy_process_group()


def near_tied_gates(model_dir, eps):
    """Rewrites MODEL_DIR's router gates near-tied (expert 1 = expert 0 + eps u); returns, by name, each
    gate as written and the function that makes the engine's nudged copy (expert 1 = expert 0 - eps u)."""
    from safetensors.torch import load_file, save_file

    generator = torch.Generator().manual_seed(0)
    gates = {}
    for file in sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors")):
        path = os.path.join(model_dir, file)
        weights = load_file(path)
        for name in sorted(n for n in weights if n.endswith(".gate.weight")):  # routers, not mlp.gate_proj
            w = weights[name].clone()
            u = torch.randn(w.shape[1], generator=generator, dtype=w.dtype) * w.std()
            w[1] = w[0] + eps * u
            weights[name] = w

            def flip(w, u=u):
                nudged = w.clone()
                nudged[1] = w[0] - eps * u
                return nudged

            gates[name] = (w, flip)
        save_file(weights, path, metadata={"format": "pt"})
    assert gates, f"no router gate (*.gate.weight) in {model_dir}"
    return gates


def run_layout(model_dir, layout, samples):
    from distflow import distributed
    from distflow.batch import to_padded
    from distflow.config.schema import ActorConfig, ModelConfig
    from distflow.layout import ParallelLayout, Placement
    from distflow.workers.megatron.worker import MegatronWorker
    from distflow.workers.rollout.sample_packing import pack_samples, routes_width

    sizes = {k: int(v) for k, v in (part.split("=") for part in layout.split(","))}
    parallel = ParallelLayout.for_world(2, **sizes)
    distributed.initialize_megatron_groups(parallel, Placement.create("colocated", 2, 1), timeout_s=600)
    distributed.seed_everything(1)
    cfg = ActorConfig(**sizes, moe_routing_replay=True, max_tokens_per_micro_batch=4096)
    actor = MegatronWorker("actor", cfg, ModelConfig(path=model_dir, dtype="float32"), parallel, "cpu")

    prompts = [SimpleNamespace(input_ids=p, data_source="", ground_truth="", extra_info={}) for p in PROMPTS]
    width = routes_width(model_dir)
    batch = to_padded(pack_samples(prompts, list(enumerate(samples)), 0, width))
    real = batch["attention_mask"].bool().clone()
    real[torch.arange(len(real)), real.sum(1) - 1] = False  # each sample's last token: no engine route
    top_k = actor.config.moe_router_topk
    engine_experts = batch["routed_experts"].long().unflatten(-1, (-1, top_k)).sort(-1).values

    replay = actor.routing_replay
    replayed = forward(actor, batch, engine_experts.shape)
    actor.routing_replay = None  # the same routers, routing by themselves
    own = forward(actor, batch, engine_experts.shape)
    actor.routing_replay = replay

    response = batch["response_mask"].bool()
    engine_logprobs = batch["rollout_logprobs"]
    return {
        "layout": layout,
        "tokens": int(real.sum()),
        "layers": engine_experts.shape[2],
        # per rank: the layers its routers hold (a pipeline stage: its own), and the mismatches there
        "layers_seen": gathered(int((replayed[1][0, 0, :, 0] >= 0).sum())),
        "replayed_mismatches": gathered(mismatches(replayed[1], engine_experts, real)),
        "own_mismatches": gathered(mismatches(own[1], engine_experts, real)),
        "replayed_gap": float((replayed[0] - engine_logprobs)[response].abs().max()),
        "own_gap": float((own[0] - engine_logprobs)[response].abs().max()),
    }


def gathered(value: int) -> list[int]:
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def forward(actor, batch, shape):
    """(log-probs [rows, seq], experts [rows, seq, layers, top_k] sorted) of one compute_logprobs, the experts
    as its routers chose them (hooks; this rank's layers: the other stages' stay -1)."""
    from megatron.core.transformer.moe.router import TopKRouter

    rows, seq, layers, top_k = shape
    experts = torch.full((rows, seq, layers, top_k), -1, dtype=torch.long)
    hooks = []
    for chunk in actor.model:
        for module in chunk.modules():
            if isinstance(module, TopKRouter):
                hooks.append(
                    module.register_forward_hook(record_into(experts, module.layer_number - 1, top_k))
                )
    try:
        logprobs, _ = actor.compute_logprobs(batch)
    finally:
        for hook in hooks:
            hook.remove()
    return logprobs, experts


def record_into(experts, layer, top_k):
    def hook(module, inputs, output):
        _, routing_map = output  # [tokens, experts] bool, tokens sequence-major: [seq, rows] flattened
        chosen = routing_map.nonzero()[:, 1].reshape(-1, top_k)  # nonzero walks each row in expert order
        rows, seq = experts.shape[:2]
        experts[:, :, layer] = chosen.reshape(-1, rows, top_k).transpose(0, 1)[:, :seq]

    return hook


def mismatches(experts, engine_experts, real):
    """Tokens x layers (of the layers this rank's routers hold) routed otherwise than by the engine."""
    held = experts[0, 0, :, 0] >= 0
    differ = (experts != engine_experts).any(-1)[:, :, held]  # [rows, seq, held layers]
    return int((differ & real[..., None]).sum())


if __name__ == "__main__":
    main()
