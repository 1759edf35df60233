"""Fault injection: the README-sized GRPO job under `torchrun --max-restarts`, with one process killed or
frozen at a random point of each run, then checks of what a cluster user relies on.

Example: python tools/fault_inject.py --runs 20 --seed 1          (about 2 minutes a run on 2 CPU cores)
         python tools/fault_inject.py --runs 4 --faults kill_rank,stop_rank
         python tools/fault_inject.py --runs 10 --faults stop@train_actor,kill@checkpoint_save
         python tools/fault_inject.py --runs 20 --placement disaggregated --max-staleness 1
         python tools/fault_inject.py --runs 20 --placement disaggregated --max-staleness 2 --partial
         python tools/fault_inject.py --runs 20 --placement disaggregated --stream-chunks 4

Each run is `distflow.train` on the copy task (examples/configs/grpo_copy_cpu.yaml: 2 processes, actor
TP=2, one SGLang engine per rank) for --steps steps with a checkpoint every 2, trainer.dist_timeout_s =
--bound-s and torchrun --max-restarts 2. Once the run has checkpointed (step 2) or at a random later point,
one fault hits a random process of the job:
  kill_rank          SIGKILL of a training rank (the OOM killer, a lost node)
  kill_engine        SIGKILL of an SGLang scheduler (an engine crash: restarted in place, no job restart)
  kill_reward_worker SIGKILL of a reward scorer process (a scorer that crashes its interpreter)
  stop_rank          SIGSTOP of a training rank (a frozen process: a hung driver, a paused VM)
  kill@<phase>, stop@<phase>
                     SIGKILL / SIGSTOP of a random rank as it enters a phase of a step after the first
                     checkpoint: generate (rollout), reward, train_actor (training), sync_weights (weight sync),
                     checkpoint_save (while a checkpoint is written); armed by distflow.testing.phase_faults
  engine@<phase>     SIGKILL of a random rank's engine processes as the rank enters generate or sync_weights
With --placement disaggregated (one training rank, rank 0, and one engine rank, rank 1) the phase faults of
generate and reward and every engine@ fault strike the engine rank, those of train_actor the training rank.
Checked per run: the job ends (no hang past the bound: --bound-s + torchrun's 30 s grace + a restart), with
exit code 0 after as many restarts as the fault needs (none for a scorer worker: the pool replaces it and
the sample scores 0; none for an engine: it restarts in place, rollout.engine_restarts); metrics.jsonl holds steps 1..T exactly once; every checkpoint folder left is intact
against its manifest; and, for the faults that restart from a checkpoint or an engine, the final weights
equal an uninterrupted run's (exact resume; the same samples from the engines that took a dead one's work).
Not compared, as they are not meant to be equal: a killed scorer's run (a reward changes), a run whose
engine died under a rollout generated ahead (it is generated again with newer weights: the log says "with
newer weights than the version"), and every run with --partial (where a weight sync interrupts a rollout
depends on timing). Last line: the tally. Exit code 1 if any run failed a check.
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from safetensors.torch import load_file

from distflow.checkpointing.directory import CheckpointDirectory, structure_problems
from distflow.models.tiny import make_tiny_model
from distflow.testing.copy_task import copy_job_args
from distflow.testing.launch import REPO_ROOT as REPO
from distflow.testing.launch import run
from distflow.testing.phase_faults import fault_env

RANDOM_FAULTS = ("kill_rank", "kill_engine", "kill_reward_worker", "stop_rank")
PHASES = ("generate", "reward", "train_actor", "sync_weights", "checkpoint_save")
PHASE_FAULTS = tuple(f"{sig}@{phase}" for phase in PHASES for sig in ("kill", "stop"))
ENGINE_FAULTS = ("engine@generate", "engine@sync_weights")
FAULTS = RANDOM_FAULTS + PHASE_FAULTS + ENGINE_FAULTS
IN_PLACE = {"kill_engine", *ENGINE_FAULTS}  # survived without a job restart (the engine restarts)
EXACT = {"kill_rank", "stop_rank", *PHASE_FAULTS, *IN_PLACE}  # final weights equal the uninterrupted run's


@dataclass
class Outcome:
    fault: str
    target: str = "-"
    at_step: int = 0
    rc: int | None = None
    seconds: float = 0.0
    restarts: int = 0
    problems: list[str] = field(default_factory=list)
    compared: bool = False
    """Its final weights were compared with the uninterrupted run's."""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1, help="chooses the faults, targets and moments")
    parser.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help=f"comma-separated, of {', '.join(RANDOM_FAULTS + ENGINE_FAULTS)}, and kill@<phase> / stop@<phase> "
        "with a phase "
        f"of {', '.join(PHASES)} (default: all)",
    )
    parser.add_argument("--steps", type=int, default=6, help="RL steps per run (checkpoints every 2)")
    parser.add_argument("--bound-s", type=int, default=60, help="trainer.dist_timeout_s: the bound on a wait")
    parser.add_argument("--work-dir", default=None, help="default: a temporary folder")
    parser.add_argument(
        "--placement",
        choices=("colocated", "disaggregated"),
        default="colocated",
        help="colocated: the README job (2 ranks, an engine each); disaggregated: one training rank and one "
        "engine rank",
    )
    parser.add_argument("--max-staleness", type=int, default=0, help="rollout.max_staleness")
    parser.add_argument("--partial", action="store_true", help="rollout.partial (needs --max-staleness > 0)")
    parser.add_argument(
        "--stream-chunks",
        type=int,
        default=1,
        help="rollout.stream_chunks (> 1: disaggregated lock-step only)",
    )
    args = parser.parse_args(argv)
    if args.partial and (args.max_staleness < 1 or args.placement != "disaggregated"):
        parser.error("--partial needs --placement disaggregated and --max-staleness >= 1 (rollout.partial)")
    if args.stream_chunks > 1 and (args.placement != "disaggregated" or args.max_staleness):
        parser.error("--stream-chunks > 1 needs --placement disaggregated and --max-staleness 0")
    faults = [f.strip() for f in args.faults.split(",")]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        parser.error(f"--faults: unknown {unknown}; choose from {', '.join(FAULTS)}")
    if args.steps < 4:
        parser.error("--steps must be >= 4 (a checkpoint at step 2 and steps after it)")
    rng = random.Random(args.seed)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="fault_inject_"))
    model, data = _task(work, args)

    print(f"[fault_inject] reference run (no fault), {args.steps} steps ...", flush=True)
    reference = work / "reference"
    shutil.rmtree(reference, ignore_errors=True)
    _job(model, data, reference, args)
    ref_weights = load_file(reference / "hf" / "model.safetensors")

    outcomes = []
    for i in range(args.runs):
        fault = rng.choice(faults)
        after_step = rng.randint(
            2, args.steps - 2
        )  # strike once this step's metrics row is written: steps remain
        out = work / f"run{i}"
        shutil.rmtree(out, ignore_errors=True)
        print(f"[fault_inject] run {i}: {fault} after step {after_step} ...", flush=True)
        outcome = _faulted_run(model, data, out, fault, after_step, rng, args)
        text = (work / f"run{i}.log").read_text(errors="replace")
        # Not meant to equal the uninterrupted run (see the module doc).
        outcome.compared = (
            fault in EXACT and not args.partial and "with newer weights than the version" not in text
        )
        outcome.problems += _check(out, args.steps, outcome.compared, ref_weights)
        outcomes.append(outcome)
        status = "ok" if not outcome.problems else "FAILED: " + "; ".join(outcome.problems)
        status += "" if outcome.compared else " (final weights not compared)"
        print(
            f"  {fault} ({outcome.target}) after step {outcome.at_step}: rc {outcome.rc}, "
            f"{outcome.restarts} restart(s), {outcome.seconds:.0f} s; {status}",
            flush=True,
        )
    failed = [o for o in outcomes if o.problems]
    by_fault = {f: sum(o.fault == f for o in outcomes) for f in faults}
    print(
        f"fault injection ({_mode(args)}): {len(outcomes) - len(failed)}/{len(outcomes)} runs survived with "
        f"every check passing ({', '.join(f'{f} x{n}' for f, n in by_fault.items() if n)}); "
        f"{sum(o.compared for o in outcomes)} compared with the uninterrupted run's final weights; "
        f"{sum(o.restarts > 0 for o in outcomes)} needed a job restart; slowest "
        f"{max((o.seconds for o in outcomes), default=0):.0f} s"
    )
    return 1 if failed else 0


def _task(work: Path, args) -> tuple[Path, Path]:
    model = make_tiny_model("qwen2", work / "model", vocab=300)
    data = work / "copy"
    if not (data / "train.parquet").is_file():
        run(
            [sys.executable, REPO / "tools/prepare_data.py", "copy", "--out", data, "--digits", "4"]
            + ["--train", "400", "--test", "8", "--seed", "1"],
            timeout_s=300,
        )
    return model, data


def _command(model: Path, data: Path, out: Path, args, extra=()) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "--max-restarts=2",
        "-m",
        "distflow.train",
        *copy_job_args(model, data, out),
        "trainer.sft_warmup_steps=2",
        "data.train_batch_size=8",
        "rollout.n=4",
        f"trainer.total_steps={args.steps}",
        "checkpoint.save_every=2",
        f"trainer.dist_timeout_s={args.bound_s}",
        "tracking.backends=[jsonl]",
        *_mode_args(args),
        *extra,
    ]


def _mode_args(args) -> list[str]:
    """The job's overrides for --placement, --max-staleness, --partial and --stream-chunks."""
    extra = [f"rollout.max_staleness={args.max_staleness}", f"rollout.stream_chunks={args.stream_chunks}"]
    if args.placement == "disaggregated":  # as distflow.testing.copy_task.disaggregated_test_job_args
        extra += ["rollout.placement=disaggregated", "rollout.num_ranks=1", "actor.tp=1"]
    if args.partial:
        extra.append("rollout.partial=true")
    return extra


def _mode(args) -> str:
    return (
        f"{args.placement}, max_staleness {args.max_staleness}"
        + (", partial" if args.partial else "")
        + (f", stream_chunks {args.stream_chunks}" if args.stream_chunks > 1 else "")
    )


def _phase_rank(sig: str, phase: str, args, rng) -> int:
    """The rank a phase fault strikes: one that runs the phase (disaggregated: rank 0 trains, rank 1 holds
    the engine, generates and scores), else a random one."""
    if args.placement == "disaggregated":
        if sig == "engine" or phase in ("generate", "reward"):
            return 1
        if phase == "train_actor":
            return 0
    return rng.randint(0, 1)


def _job(model: Path, data: Path, out: Path, args) -> None:
    run(_command(model, data, out, args), timeout_s=_limit(args))


def _limit(args) -> float:
    """The longest a run may take: three attempts, each bounded (start-up, steps, a wait that times out)."""
    return 3 * (240 + 20 * args.steps + args.bound_s + 30)


def _faulted_run(model, data, out: Path, fault: str, after_step: int, rng, args) -> Outcome:
    outcome = Outcome(fault, at_step=after_step)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    extra = []
    if "@" in fault:  # armed inside the job: the rank strikes itself (or its engine) as it enters the phase
        sig, phase = fault.split("@")
        rank = _phase_rank(sig, phase, args, rng)
        step = after_step + (after_step % 2 if phase == "checkpoint_save" else 1)  # checkpoints: even steps
        outcome.target, outcome.at_step = f"rank {rank} in {phase} of step {step}", step
        env.update(fault_env(phase, step, rank, sig.upper()))
        extra = ["dag.pipeline=distflow.testing.phase_faults:pipeline"]
    log = (out.parent / f"{out.name}.log").open("w")
    start = time.monotonic()
    job = subprocess.Popen(
        _command(model, data, out, args, extra),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=REPO,
        start_new_session=True,
    )
    if "@" not in fault:
        striker = threading.Thread(
            target=_strike, args=(job, out, fault, after_step, rng, outcome), daemon=True
        )
        striker.start()
    try:
        outcome.rc = job.wait(timeout=_limit(args))
    except subprocess.TimeoutExpired:
        outcome.problems.append(f"no exit within {_limit(args):.0f} s (a hang)")
    finally:
        _kill_tree(job)
        log.close()
    outcome.seconds = time.monotonic() - start
    text = (out.parent / f"{out.name}.log").read_text(errors="replace")
    outcome.restarts = max(0, text.count("pre-flight checks passed") - 1)  # rank 0 logs it once an attempt
    if fault in IN_PLACE and outcome.restarts:
        outcome.problems.append(
            f"{outcome.restarts} job restart(s): the engine should have restarted in place"
        )
    if fault in IN_PLACE and "[rollout] engine" not in text:
        outcome.problems.append("no engine restart in the log")
    if outcome.rc != 0:
        outcome.problems.append(f"exit code {outcome.rc} (log: {out.parent / (out.name + '.log')})")
    if outcome.target == "-":
        outcome.problems.append("the fault found no target (the run ended first?)")
    if "@" in fault and "[phase_faults]" not in text:
        outcome.problems.append("the armed fault never struck")
    return outcome


def _strike(job, out: Path, fault: str, after_step: int, rng, outcome: Outcome) -> None:
    """Waits for step `after_step`'s metrics row, then hits one process of the job's first attempt."""
    metrics = out / "metrics.jsonl"
    seen, step_s = 0, 1.0  # rows so far; the last step's duration (disaggregated steps take well under 1 s)
    last = time.monotonic()
    while job.poll() is None:
        rows = len(metrics.read_text().splitlines()) if metrics.is_file() else 0
        if rows > seen:
            now = time.monotonic()
            if seen:
                step_s = (now - last) / (rows - seen)
            seen, last = rows, now
        if rows >= after_step:
            break
        time.sleep(0.05)
    # somewhere inside the next step: generation, scoring, training, sync
    time.sleep(rng.uniform(0.0, min(1.0, step_s)))
    targets = _targets(job.pid, fault)
    if not targets:
        return
    name, proc = rng.choice(targets)
    outcome.target = name
    try:
        proc.send_signal(signal.SIGSTOP if fault == "stop_rank" else signal.SIGKILL)
    except psutil.NoSuchProcess:
        outcome.target = f"{name} (gone before the fault)"


def _targets(root_pid: int, fault: str) -> list[tuple[str, psutil.Process]]:
    found = []
    try:
        procs = psutil.Process(root_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    for proc in procs:
        try:
            cmdline = " ".join(proc.cmdline())
            environ = proc.environ() if fault in ("kill_rank", "stop_rank") else {}
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if (
            fault in ("kill_rank", "stop_rank")
            and "-m distflow.train" in cmdline
            and "torch.distributed.run" not in cmdline
        ):
            found.append((f"rank {environ.get('RANK', '?')}", proc))
        elif fault == "kill_engine" and "scheduler" in (proc.name() + cmdline).lower():
            found.append((f"engine scheduler {proc.pid}", proc))
        elif fault == "kill_reward_worker" and "distflow.rewards._worker" in cmdline:
            found.append((f"reward worker {proc.pid}", proc))
    return found


def _kill_tree(job) -> None:
    try:
        os.killpg(job.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    job.wait()


def _check(out: Path, steps: int, compare: bool, ref_weights: dict) -> list[str]:
    problems = []
    metrics = out / "metrics.jsonl"
    rows = (
        [json.loads(line)["step"] for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    )
    if rows != list(range(1, steps + 1)):
        problems.append(f"metrics.jsonl steps {rows}, not 1..{steps} once each")
    directory = CheckpointDirectory.of_run(out)
    for step in directory.complete_steps():
        for problem in structure_problems(directory.final(step)):
            problems.append(f"checkpoint step_{step}: {problem}")
    final = out / "hf" / "model.safetensors"
    if compare and final.is_file():
        weights = load_file(final)
        worst = max((weights[n] - t).abs().max().item() for n, t in ref_weights.items())
        if worst > 1e-6:
            problems.append(f"final weights differ from the uninterrupted run's by {worst:.2e}")
    elif not final.is_file():
        problems.append("no final export (the run did not finish)")
    return problems


if __name__ == "__main__":
    sys.exit(main())
