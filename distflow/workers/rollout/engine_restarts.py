"""EngineRestarts: the restart in place of a rollout worker's dead SGLang engine, so that an engine death costs
its in-flight work rather than a job restart (docs/fault_tolerance.md, "An engine dies").

A single-node engine is restarted by its owner alone, wherever the owner finds it dead (in a rollout, before
a weight sync, before submitting a partial rollout). An engine spanning nodes has processes on several ranks
that must restart them together, so it restarts only in the collective revive_dead_engines every rank runs
before a weight sync. Either way the restarts of an engine are bounded by rollout.engine_restarts per attempt;
past them the death is raised and a torchrun restart resumes the job from its last checkpoint.
"""

import contextlib

import torch.distributed as dist

from distflow.workers.rollout import engine_health, sglang_engine
from distflow.workers.rollout.engine_health import EngineDiedError
from distflow.workers.rollout.engine_state import state_of


class EngineRestarts:
    """The restarts of one RolloutWorker's engine (or of its node's share of an engine over nodes).

    worker: the RolloutWorker whose engine this restarts: it reads the worker's placement (engine_index,
    owner, engine_nnodes, node_rank), starts the engine through worker.start_engine and puts the new one in
    worker.engine (owner) or worker.node_engine (a later node's share), moving worker.in_flight onto it."""

    def __init__(self, worker):
        self.worker = worker
        self.count = 0  # this engine's restarts in this attempt (rollout.engine_restarts)

    @property
    def at_syncs(self) -> bool:
        """Whether this rank's engine restarts only in a weight sync's collective revive_dead_engines: an
        engine over nodes, whose processes belong to several ranks that must restart them together (the
        engine's owner alone restarts any other engine where it finds it dead)."""
        return self.worker.engine_nnodes > 1

    def _budget_refusal(self) -> str | None:
        """Why this engine cannot be restarted in place now (None: it can)."""
        budget = self.worker.cfg.rollout.engine_restarts
        if self.count >= budget:
            return (
                f"engine {self.worker.engine_index} has used its {budget} restart(s) in this attempt: "
                "rollout.engine_restarts"
            )
        return None

    def why_not_restartable(self) -> str | None:
        """Why this rank's dead engine cannot be restarted in place; None if it can, or if none is dead here."""
        if self._dead_share_reason() is None:
            return None
        return self._budget_refusal()

    def raise_unless_restartable(self, died: Exception) -> None:
        """Raises `died` when the engine's restarts are spent: the job then stops, and a torchrun restart
        resumes it from its last checkpoint."""
        why = self._budget_refusal()
        if why is not None:
            raise EngineDiedError(f"{died}\n({why})") from died

    def restart_engine(self, cause: str) -> None:
        """Owner of a dead engine: stops what is left of it and starts it again from model.path, with the
        version count it had. Its weights are stale (generate refuses them) until the next weight sync loads
        the actor's current ones through the normal path; the resharder picks the new engine up there.
        Partial rollouts in flight on it move to the new engine, and that sync continues their unfinished
        requests there (partial_generation.InFlightGeneration.move_to). An engine over nodes restarts only
        in revive_dead_engines, where its other nodes' ranks restart their shares with it.
        cause: what happened to it, for the log line."""
        w = self.worker
        moved = (
            f"; the unfinished requests of the rollouts of steps {sorted(w.in_flight)} in flight on it are "
            "re-issued after the next weight sync"
            if w.in_flight
            else ""
        )
        print(
            f"[rollout] engine {w.engine_index} {cause}; it restarts ({self.count + 1} of "
            f"rollout.engine_restarts={w.cfg.rollout.engine_restarts}){moved}",
            flush=True,
        )
        dead, version = w.engine, state_of(w.engine).version
        with contextlib.suppress(Exception):  # whatever survived of it (a detokenizer, a frozen scheduler)
            sglang_engine.shutdown_engine(dead)
        w.engine = w.start_engine()
        self.count += 1
        state = state_of(w.engine)
        state.version = version
        state.stale_reason = (
            f"restarted after a death ({self.count} restart(s)); it holds model.path's weights "
            "until the next weight sync"
        )
        w.released = set()
        for generation in w.in_flight.values():
            generation.move_to(w.engine)

    def revive_dead_engine(self, before: str = "the weight sync") -> None:
        """An owner whose engine died outside a rollout (between steps, in a failed sync, with partial
        rollouts in flight) restarts it, within rollout.engine_restarts: before a weight sync (on every
        rank, revive_dead_engines), or before submitting a partial rollout. An engine over nodes is left
        dead here: it restarts at the next sync."""
        w = self.worker
        if not w.owner or self.at_syncs or not engine_health.is_dead(w.engine):
            return
        monitor = engine_health.monitor_of(w.engine)
        self.raise_unless_restartable(monitor.error(before))
        self.restart_engine(f"is dead ({monitor.dead_reason})")

    def revive_dead_engines(self) -> None:
        """Collective (every rank), before a weight sync: restarts the dead engines, within
        rollout.engine_restarts. Engines over nodes restart here only, every node's share together: a
        share found dead on any of its ranks (a scheduler killed on a later node may leave the owner's side
        waiting, or alive and idle) restarts the whole engine, and its ranks rendezvous anew
        (multi_node_engine.node_args). When any dead engine's restarts are spent, every rank raises the
        same error, so none waits in the sync for ranks that left."""
        if not self.at_syncs:
            self.revive_dead_engine()
            return
        w = self.worker
        reason = self._dead_share_reason()
        refused = None if reason is None else self._budget_refusal()
        reports = [None] * dist.get_world_size()
        dist.all_gather_object(reports, (w.engine_index, reason, refused))
        refusals = [f"rank {rank}: {r}" for rank, (_, _, r) in enumerate(reports) if r]
        if refusals:
            first = next(
                f"engine {e} on rank {rank}: {why}" for rank, (e, why, _) in enumerate(reports) if why
            )
            raise EngineDiedError(f"{first}; not restarted in place: {'; '.join(refusals)}")
        dead = {e: why for e, why, _ in reversed(reports) if why}  # the first rank's reason wins
        if w.engine_index not in dead:
            return
        cause = f"is dead ({dead[w.engine_index]})"
        if w.owner:
            self.restart_engine(f"{cause}; its {w.engine_nnodes} nodes restart it together")
        elif w.node_engine is not None:
            print(
                f"[rollout] engine {w.engine_index} node {w.node_rank} {cause}; its share restarts "
                "with the engine",
                flush=True,
            )
            with contextlib.suppress(Exception):  # whatever survived of it
                sglang_engine.shutdown_engine(w.node_engine)
            w.node_engine = w.start_engine()
            self.count += 1

    def dead_until_a_sync(self, step: int) -> bool:
        """An engine over nodes found dead when submitting step `step`'s rollout waits for the next weight
        sync to restart it (revive_dead_engines): nothing is submitted, and the step generates its rollout
        when it takes it, on the restarted engine."""
        if not (self.at_syncs and engine_health.is_dead(self.worker.engine)):
            return False
        print(
            f"[rollout] engine {self.worker.engine_index} is dead; step {step}'s rollout is not submitted: the "
            "next weight sync restarts the engine, and the step generates its rollout when it takes it",
            flush=True,
        )
        return True

    def _dead_share_reason(self) -> str | None:
        """Why this rank's engine, or its node's share of one, is dead (None: alive, or none here). Looks
        at the processes now: a death since the monitor's last poll counts."""
        w = self.worker
        engine = w.engine if w.owner else w.node_engine
        if engine is None or not engine_health.check_now(engine):
            return None
        return engine_health.monitor_of(engine).dead_reason
