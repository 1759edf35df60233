"""Weight sync: the trained actor's weights into the rollout engines (every rank, collective).

One WeightSync object per run, built by the trainer, one class per sync.method:
- ReshardedSync ("auto", "reshard"): the layout-aware resharder (distflow.coordination.weights), built at the
  first sync and kept for the run: every rank writes the slices of its own Megatron shards straight into the
  staging buffers of the engine ranks that need them, each engine rank receiving only its own SGLang shards
  (families with a shard layout: the dense ones and Mixtral / Qwen2-MoE / Qwen3-MoE; "auto" stages full
  HF-named tensors the same way for the others and for models SGLang's CPU engine pads,
  sglang_layout.cpu_engine_pads).
- FullSync ("full"): the simple fallback through Hugging Face-named full tensors: the actor is gathered on
  rank 0, broadcast to every rank and loaded by each engine owner through SGLang's own loader.
Both return sync/seconds, sync/bytes (bytes loaded into all engines), sync/busiest_rank_bytes (bytes the
busiest rank sends) and sync/gbps, and leave every rank's RolloutWorker.weight_version at the new version.
The `sync_weights` DAG node runs the run's WeightSync.
"""

import time

import torch.distributed as dist

from distflow.coordination.weights import WeightResharder, WeightSyncError, engine_side, megatron_tensors
from distflow.workers.rollout.worker import placement_device


def sync_weights(ctx, inputs):
    ctx.record(**ctx.weight_sync.sync())
    # Engines restarted in place so far in this attempt (at a rollout's death, or in this sync), summed over
    # the owners (an engine over nodes counts its restarts on each node's rank too, for its budget).
    rollout = ctx.workers.rollout
    ctx.record(**{"rollout/engine_restarts": rollout.restarts.count if rollout.owner else 0})
    return {"weight_version": ctx.workers.rollout.weight_version}


class WeightSync:
    """Moves the actor's current weights into every engine; `sync()` is collective over the job."""

    def __init__(self, cfg, cluster, rank: int, actor, rollout):
        self.cfg, self.cluster, self.rank = cfg, cluster, rank
        self.actor, self.rollout = actor, rollout  # actor: None on the rollout-only ranks (disaggregated)

    @staticmethod
    def for_run(cfg, cluster, rank: int, actor, rollout) -> "WeightSync":
        sync_class = FullSync if cfg.sync.method == "full" else ReshardedSync
        return sync_class(cfg, cluster, rank, actor, rollout)

    @staticmethod
    def engine_loaders() -> tuple[str, ...]:
        """The SGLang custom weight loaders every engine starts with, for the resharder's loads and probes
        (and harmless to the full sync, which loads through SGLang's own loader)."""
        return tuple(engine_side.engine_args()["custom_weight_loader"])

    def sync(self) -> dict[str, float]:
        """Collective: the engines hold the actor's weights as the next version; returns the sync/* metrics.
        An engine found dead is restarted first; one that dies during the sync is restarted and the sync runs
        again (every rank hears of the death in the same exchange, so all retry), within
        rollout.engine_restarts."""
        for attempt in range(self.cfg.rollout.engine_restarts + 1):
            self.rollout.restarts.revive_dead_engines()  # raises once a dead engine's restarts are spent
            try:
                return self._sync()
            except WeightSyncError as exc:
                if not (exc.engines_died and attempt < self.cfg.rollout.engine_restarts):
                    raise
                refused = self.restart_refusals()
                if refused:
                    raise WeightSyncError(f"{exc}; not restarted in place: {refused}", exc.failures) from exc
                if self.rank == 0:
                    print(
                        f"[sync] {str(exc).splitlines()[0]}; restarting the engine and syncing again",
                        flush=True,
                    )

    def resync(self) -> dict[str, float]:
        """Collective: the engines load the actor's current weights again as the version they serve now, not
        a new one. For an engine restarted mid-rollout (nodes/rollout.generate_samples), before its rollout is
        generated again: the actor has not trained since the sync that made that version (colocated ranks
        generate before they train; disaggregated ones regenerate when the step takes the rollout)."""
        self.continue_versions_from(self.rollout.weight_version - 1)
        return self.sync()

    def _sync(self) -> dict[str, float]:
        raise NotImplementedError

    def restart_refusals(self) -> str:
        """Collective: why a dead engine cannot be restarted in place ("" when every one can), the same on
        every rank, so that all ranks retry the sync or all raise its error."""
        answers = [None] * dist.get_world_size()
        dist.all_gather_object(answers, self.rollout.restarts.why_not_restartable())
        return "; ".join(f"rank {rank}: {why}" for rank, why in enumerate(answers) if why)

    def continue_versions_from(self, version: int) -> None:
        """On resume: the next completed sync is `version` + 1, as in the run that wrote the checkpoint."""
        self.rollout.continue_versions_from(version)


class ReshardedSync(WeightSync):
    MODES = {"auto": "auto", "reshard": "shards"}  # sync.method -> the resharder's plan mode

    def __init__(self, *args):
        super().__init__(*args)
        self.resharder = None  # built at the first sync: the engines and the actor's shards exist by then

    def _sync(self) -> dict[str, float]:
        if self.resharder is None:
            self.resharder = self._build_resharder()
            if self.rank == 0:
                print(self.resharder.plan.describe(), flush=True)
        elif self.resharder.engine is not self.rollout.engine:  # restarted since the last sync
            self.resharder.replace_engine(self.rollout.engine)
        self.rollout.make_resident(
            only=("weights",)
        )  # the KV cache comes back at generation, after the staging
        # The parameters again: an optimizer may have replaced their storage since the last sync.
        actor = self.actor
        stats = self.resharder.sync(
            megatron_tensors(actor.chunks, actor.config) if actor is not None else None
        )
        self.rollout.weights_synced(stats.version)
        return stats.metrics()

    def continue_versions_from(self, version: int) -> None:
        super().continue_versions_from(version)
        if self.resharder is not None:
            self.resharder.version = version

    def _build_resharder(self) -> WeightResharder:
        cfg, cluster, rollout = self.cfg, self.cluster, self.rollout
        common = dict(
            engine=rollout.engine,
            engine_dtype=cfg.rollout.dtype or cfg.model.dtype,
            mode=self.MODES[cfg.sync.method],
            timeout_s=cfg.trainer.dist_timeout_s,
        )
        if self.actor is not None:
            resharder = WeightResharder.for_megatron_worker(self.actor, cluster.placement, cfg.sync, **common)
        else:  # a rollout-only rank (disaggregated placement): it receives, and sends nothing
            resharder = WeightResharder.for_rollout_rank(
                cfg.model.path,
                cluster.actor,
                cluster.placement,
                cfg.sync,
                engine_device=placement_device(cfg),
                **common,
            )
        resharder.version = rollout.weight_version  # a resumed run counts on from its checkpoint
        return resharder


class FullSync(WeightSync):
    def _sync(self) -> dict[str, float]:
        start = time.perf_counter()
        # Full tensors on global rank 0 (a training rank), None elsewhere.
        state = self.actor.export_hf_state() if self.actor is not None else None
        payload = [sorted(state.items()) if state is not None else None]
        dist.broadcast_object_list(payload, src=0)
        self.rollout.load_weights(payload[0])
        nbytes = sum(t.numel() * t.element_size() for _, t in payload[0])
        seconds = time.perf_counter() - start
        total = nbytes * self.cluster.placement.num_engines
        # Rank 0 holds the whole model and sends it to every other rank.
        busiest = nbytes * (dist.get_world_size() - 1)
        return {
            "sync/seconds": seconds,
            "sync/bytes": total,
            "sync/busiest_rank_bytes": busiest,
            "sync/gbps": total / max(seconds, 1e-9) / 1e9,
            "sync/version": self.rollout.weight_version,
        }
