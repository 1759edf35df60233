"""A fault at a fixed point of a real job, for the fault-tolerance tests and tools/fault_inject.py.

`dag.pipeline=distflow.testing.phase_faults:pipeline` runs the built-in pipeline of
$DISTFLOW_FAULT_PIPELINE (default grpo) with one change: in the job's first attempt (before any torchrun
restart), when rank $DISTFLOW_FAULT_RANK (or every rank: "all") starts node $DISTFLOW_FAULT_NODE of step $DISTFLOW_FAULT_STEP, it
sends itself $DISTFLOW_FAULT_SIGNAL (KILL: a rank lost; STOP: a frozen rank; ENGINE: its engine's processes,
or its node's share of an engine over nodes, SIGKILLed, at each step of a comma-separated $DISTFLOW_FAULT_STEP, such as "1,3"). Nodes cover the phases:
generate (rollout), reward, old_logprob/train_actor (training), sync_weights (weight sync). The checkpoint
save is not a node: $DISTFLOW_FAULT_NODE=checkpoint_save strikes while step $DISTFLOW_FAULT_STEP's
checkpoint is being written (a watcher thread sees its staging folder appear).
"""

import contextlib
import dataclasses
import os
import signal
import threading
import time
from pathlib import Path

from distflow.checkpointing.directory import CheckpointDirectory
from distflow.dag.builtin import BUILTIN
from distflow.dag.graph import Pipeline

ENV = ("DISTFLOW_FAULT_NODE", "DISTFLOW_FAULT_STEP", "DISTFLOW_FAULT_RANK", "DISTFLOW_FAULT_SIGNAL")
CHECKPOINT_SAVE = "checkpoint_save"


def fault_env(
    node: str, step: int | str, rank: int | str, sig: str, pipeline: str = "grpo"
) -> dict[str, str]:
    """The environment that arms one fault (sig: "KILL", "STOP" or "ENGINE"; rank: a rank or "all"; step: a
    step, or for ENGINE steps such as "1,3")."""
    return {
        "DISTFLOW_FAULT_NODE": node,
        "DISTFLOW_FAULT_STEP": str(step),
        "DISTFLOW_FAULT_RANK": str(rank),
        "DISTFLOW_FAULT_SIGNAL": sig,
        "DISTFLOW_FAULT_PIPELINE": pipeline,
    }


def pipeline(cfg) -> Pipeline:
    base = BUILTIN[os.environ.get("DISTFLOW_FAULT_PIPELINE", "grpo")](cfg)
    node, step, rank, sig = (os.environ[name] for name in ENV)
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    armed = first_attempt and rank in ("all", os.environ["RANK"])
    if not armed:
        return base
    if sig == "ENGINE":
        base.node(node)
        steps = {int(s) for s in step.split(",")}
        base.nodes = [_engine_killed(n, steps) if n.id == node else n for n in base.nodes]
        return base
    strike = getattr(signal, f"SIG{sig}")
    if node == CHECKPOINT_SAVE:
        _watch_checkpoint(Path(cfg.trainer.output_dir) / "checkpoints", int(step), strike)
        return base
    base.node(node)  # KeyError naming a node the pipeline lacks
    base.nodes = [_armed(n, int(step), strike) if n.id == node else n for n in base.nodes]
    return base


def _armed(node, step: int, strike):
    inner = node.resolve()

    def fn(ctx, inputs):
        if ctx.step.step == step:
            print(
                f"[phase_faults] rank {os.environ['RANK']}: {strike.name} in {node.id} of step {step}",
                flush=True,
            )
            os.kill(os.getpid(), strike)
        return inner(ctx, inputs)

    return dataclasses.replace(node, fn=fn)


def _engine_killed(node, steps: set[int]):
    """The node, with this rank's engine processes SIGKILLed as it starts at each of `steps` (in generate:
    the engine dies under the rollout's first request; in sync_weights: under the sync's first call). The
    step of a rollout generated ahead (rollout.max_staleness) is the step that will train on it."""
    inner = node.resolve()
    struck: set[int] = set()  # once a step: a rollout generated again after its loss is not killed again

    def fn(ctx, inputs):
        rollout, step = ctx.workers.rollout, ctx.step.step
        engine = rollout.engine or rollout.node_engine  # a later node's share of an engine over nodes
        if step in steps - struck and engine is not None:
            struck.add(step)
            print(
                f"[phase_faults] rank {os.environ['RANK']}: engine killed in {node.id} of step {step}",
                flush=True,
            )
            for pid in engine.get_all_child_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return inner(ctx, inputs)

    return dataclasses.replace(node, fn=fn)


def _watch_checkpoint(folder: Path, step: int, strike) -> None:
    """Strikes once step `step`'s staging folder holds its first file (the save writes aside, then renames)."""
    staging = CheckpointDirectory(folder).staging(step)

    def watch():
        while True:
            try:
                started = staging.is_dir() and any(staging.iterdir())
            except OSError:  # renamed or removed between the two looks
                started = False
            if started:
                print(
                    f"[phase_faults] rank {os.environ['RANK']}: {strike.name} while saving step {step}",
                    flush=True,
                )
                os.kill(os.getpid(), strike)
                return
            time.sleep(0.005)

    threading.Thread(target=watch, name="phase-fault-watch", daemon=True).start()
