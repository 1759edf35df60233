"""MoE routing replay (actor.moe_routing_replay, "R3"): the actor's forwards send each token to the experts the
engine chose when it sampled that token, instead of routing it again.

Why: the engine's router and Megatron's never compute exactly the same scores (kernels, precision, a weight
update in between), and a token near a routing tie goes to different experts in the two. Its log-probs then
differ by far more than numerical noise, and the policy gradient follows experts the samples never used,
which makes MoE runs collapse. With replay, only the experts' mixing weights are recomputed (Megatron-Core's
RouterReplay gathers its own scores at the given experts), so gradients still reach the router.

A micro-batch carries `routed_experts` [rows, seq, layers * top_k] (from the rollout's samples, see
workers/rollout/sample_packing.pack_samples). Before each model chunk's forward, every router of that chunk (its
global layer number picks the columns) gets its layer's experts in Megatron's token order: sequence-major
([seq, rows] flattened), and with sequence parallelism only this TP rank's part of the sequence. Padding
tokens take experts 0..top_k-1 (distinct, as a router's choice is; their outputs are never read).

Megatron-Core keeps every RouterReplay in one process-wide list (the reference model's too): the targets are
set on this model's own routers, never through that list.
"""

import torch


class RoutingReplay:
    """The routers of one model's chunks (built with moe_enable_routing_replay), fed per micro-batch."""

    def __init__(self, chunks: list, config):
        self.top_k = config.moe_router_topk
        self.sequence_parallel = config.sequence_parallel
        self.routers = {id(chunk): _routers_of(chunk) for chunk in chunks}
        if not any(self.routers.values()):
            raise ValueError("MoE routing replay: the model has no MoE router with routing replay enabled")

    def before_forward(self, chunk, micro_batch: dict) -> None:
        """Gives chunk's routers the micro-batch's routes (nothing when it carries none: they route)."""
        from megatron.core import parallel_state as ps
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        routes = micro_batch.get("routed_experts")
        if routes is None:
            return
        k = self.top_k
        real = micro_batch["attention_mask"].bool()[..., None]
        padding_experts = torch.arange(k, device=routes.device)
        for layer, replay in self.routers[id(chunk)]:
            experts = routes[:, :, layer * k : (layer + 1) * k].long()
            experts = torch.where(real, experts, padding_experts).transpose(0, 1)  # [seq, rows, k]
            if self.sequence_parallel:
                experts = experts.chunk(ps.get_tensor_model_parallel_world_size())[
                    ps.get_tensor_model_parallel_rank()
                ]
            replay.clear_indices()
            replay.set_target_indices(experts.reshape(-1, k).contiguous())
            replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)

    def finish(self) -> None:
        """After a schedule: the routers route by themselves again and hold no routes."""
        for routers in self.routers.values():
            for _, replay in routers:
                replay.clear_indices()
                replay.clear_router_replay_action()


def _routers_of(chunk) -> list[tuple[int, object]]:
    """(0-based global layer, its RouterReplay) of each MoE router in a model chunk."""
    from megatron.core.transformer.moe.router import TopKRouter

    found = []
    for module in chunk.modules():
        if isinstance(module, TopKRouter) and module.router_replay is not None:
            found.append((module.layer_number - 1, module.router_replay))
    return found
