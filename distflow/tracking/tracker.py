"""Tracker: one `log(metrics, step)` fanned out to console, JSONL, TensorBoard and W&B, on rank 0 only.

Metric names (shared by every pipeline, so that plots and dashboards work for all of them; the full glossary,
with each metric's reduction over ranks and its verl name, is docs/metrics.md):
  timing_s/<node>, timing_s/step      seconds in each DAG node this step, and the whole step
  perf/*                              throughput (tokens/s per GPU), time_per_step, mfu/actor (GPU), memory
  actor/*, critic/*                   losses, KL, entropy, grad norm, lr, clip fractions
  rollout/*                           response_length/*, prompt_length/*, tokens, samples, weight_version
  reward/*                            reward/mean|max|min, reward/shaped/* (after KL / overlong shaping), errors
  advantage/*                         advantage/mean|max|min
  val/*                               val/reward/mean, val/accuracy, val/<data_source>/reward/mean|accuracy
  sync/*                              weight sync into the engines
  data/*, dapo/*                      data pipeline counters, dynamic sampling
Other names are logged too, with a one-time warning. tracking.metric_names=verl writes the metrics that have
a verl twin under verl's name instead (distflow/tracking/aliases.py: reward/mean -> critic/score/mean, ...).
`log_samples(rows, step)` records a table of validation samples (W&B table, TensorBoard text, samples.jsonl).
TensorBoard also gets the run's config as a text summary; W&B gets it as the run config.

Resume: construct with the `run_id` and last step saved in the checkpoint. JSONL appends to the same file
(moving lines after `resume_step`, logged before a crash but not checkpointed, to `<file>.dropped`; a fresh
run passes resume_step 0), TensorBoard purges events
after it, and W&B resumes the same run id.
"""

import json
import logging
import math
import os
import secrets
import time
from pathlib import Path

from distflow.tracking.aliases import alias, rename

logger = logging.getLogger(__name__)

METRIC_PREFIXES = (
    "timing_s/",
    "perf/",
    "actor/",
    "critic/",
    "rollout/",
    "rollout_corr/",
    "reward/",
    "advantage/",
    "val/",
    "sync/",
    "data/",
    "dapo/",
    "trainer/",
)
# What the console line shows first (those present); everything is in metrics.jsonl.
_CONSOLE_KEYS = (
    "reward/mean",
    "val/reward/mean",
    "actor/pg_loss",
    "actor/kl",
    "actor/entropy",
    "rollout/response_length/mean",
    "perf/throughput",
    "perf/time_per_step",
    "sync/seconds",
)
_CONSOLE_MAX = 8


class Tracker:
    """Metrics sink of one run. Every rank may build one; only rank 0 writes (elsewhere every call is a no-op).

    cfg: a TrackingConfig (project, run_name, backends, wandb_mode, metric_names). output_dir: where
    metrics.jsonl, samples.jsonl, tensorboard/ and wandb/ go. run_id: the id of the run to continue (from the
    checkpoint), or None for a new run; `self.run_id` is the id to store in checkpoints (rank 0's is
    authoritative). resume_step: the step of the checkpoint resumed from (later entries are dropped). config:
    the run's config, for W&B and TensorBoard.
    total_steps: the run's length, for the console's progress (step k/N, percent, time left).
    """

    def __init__(
        self,
        cfg,
        output_dir: str | Path,
        *,
        rank: int = 0,
        run_id: str | None = None,
        resume_step: int | None = None,
        config: dict | None = None,
        total_steps: int | None = None,
    ):
        self.rank = rank
        self.output_dir = Path(output_dir)
        self.run_id = run_id or (_new_run_id() if rank == 0 else None)
        self._backends = []
        self._warned_prefixes: set[str] = set()
        self.metric_names = getattr(cfg, "metric_names", "distflow")
        alias("reward/mean", self.metric_names)  # an unknown scheme fails here, not at the first step
        if rank != 0:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        name = cfg.run_name or self.output_dir.resolve().name
        for backend in cfg.backends:
            if backend == "console":
                self._backends.append(_Console(total_steps, self.metric_names))
            elif backend == "jsonl":
                self._backends.append(
                    _Jsonl(self.output_dir / "metrics.jsonl", resume_step, self.output_dir / "samples.jsonl")
                )
            elif backend == "tensorboard":
                self._backends.append(_TensorBoard(self.output_dir / "tensorboard", resume_step, config))
            elif backend == "wandb":
                if cfg.wandb_mode != "disabled":
                    self._backends.append(
                        _Wandb(cfg.project, name, self.run_id, cfg.wandb_mode, self.output_dir, config)
                    )
            else:
                raise ValueError(
                    f"unknown tracking backend {backend!r}; choose from console, jsonl, tensorboard, wandb"
                )

    def log(self, metrics: dict, step: int) -> None:
        """Records `metrics` (name -> number; tensors and numpy scalars are converted) for `step`."""
        if not self._backends:
            return
        clean = {}
        for key, value in metrics.items():
            if hasattr(value, "item"):
                value = value.item()
            if isinstance(value, bool):
                value = int(value)
            if not isinstance(value, (int, float)):
                raise TypeError(f"metric {key!r} is {type(value).__name__}, not a number")
            clean[key] = value
            self._check_name(key)
        clean = rename(clean, self.metric_names)
        for backend in self._backends:
            backend.log(clean, step)

    def log_samples(self, rows: list[dict], step: int, name: str = "val/samples") -> None:
        """Records a table of samples for `step` (rows: dicts with the same keys, e.g. data_source, prompt,
        response, ground_truth, reward): a W&B table `name`, a TensorBoard text summary, and one line per
        row {"step", "table", **row} in samples.jsonl. The console does not print them."""
        if not self._backends or not rows:
            return
        columns = list(rows[0])
        if any(list(row) != columns for row in rows):
            raise ValueError(f"log_samples: every row needs the columns {columns}")
        for backend in self._backends:
            if hasattr(backend, "log_samples"):
                backend.log_samples(name, columns, rows, step)

    def close(self) -> None:
        for backend in self._backends:
            backend.close()
        self._backends = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _check_name(self, key: str) -> None:
        if not key.startswith(METRIC_PREFIXES):
            prefix = key.split("/")[0]
            if prefix not in self._warned_prefixes:
                self._warned_prefixes.add(prefix)
                logger.warning(
                    "metric %r is outside the naming conventions (%s)", key, ", ".join(METRIC_PREFIXES)
                )


def wandb_mode(mode: str) -> str:
    """auto -> online when WANDB_API_KEY is set, else offline (no network needed)."""
    if mode == "auto":
        return "online" if os.environ.get("WANDB_API_KEY") else "offline"
    return mode


def _new_run_id() -> str:
    # W&B's id alphabet: lowercase letters and digits.
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(8))


class _Console:
    """One line per step, led by the progress "step k/N (p%, ~time left)": a line per step reads better in
    torchrun's interleaved, often redirected output than a redrawn bar."""

    def __init__(self, total_steps: int | None = None, metric_names: str = "distflow"):
        self.total_steps = total_steps
        self.keys = [alias(k, metric_names) for k in _CONSOLE_KEYS]  # metrics arrive under the scheme's names
        self._first: tuple[int, float] | None = None  # (step, time) of the first step logged by this process

    def log(self, metrics: dict, step: int) -> None:
        shown = [k for k in self.keys if k in metrics][:_CONSOLE_MAX]
        parts = [self._progress(step)] + [f"{k} {_short(metrics[k])}" for k in shown]
        hidden = len(metrics) - len(shown)
        print(" | ".join(parts) + (f" (+{hidden} more)" if hidden else ""), flush=True)

    def _progress(self, step: int) -> str:
        now = time.monotonic()
        if self._first is None:
            self._first = (step, now)
        if not self.total_steps:
            return f"step {step}"
        text = f"step {step}/{self.total_steps} ({100 * step / self.total_steps:.0f}%"
        first_step, start = self._first
        if step > first_step:  # steps since this process's first one set the pace (resumed runs too)
            left = (now - start) / (step - first_step) * (self.total_steps - step)
            text += f", ~{_duration(left)} left"
        return text + ")"

    def close(self) -> None:
        pass


class _Jsonl:
    """One JSON object per line, {"step", "time", **metrics}, flushed after each step; sample tables go to
    a second file (samples.jsonl), one row per line."""

    def __init__(self, path: Path, resume_step: int | None, samples_path: Path):
        self.file = _open_for_append(path, resume_step)
        self.samples_path, self.resume_step = samples_path, resume_step
        self.samples_file = None  # opened at the first table: runs without validation leave no empty file

    def log(self, metrics: dict, step: int) -> None:
        record = {"step": step, "time": time.time(), **{k: _json_number(v) for k, v in metrics.items()}}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def log_samples(self, name: str, columns: list[str], rows: list[dict], step: int) -> None:
        if self.samples_file is None:
            self.samples_file = _open_for_append(self.samples_path, self.resume_step)
        for row in rows:
            self.samples_file.write(json.dumps({"step": step, "table": name, **row}, default=str) + "\n")
        self.samples_file.flush()

    def close(self) -> None:
        self.file.close()
        if self.samples_file is not None:
            self.samples_file.close()


def _open_for_append(path: Path, resume_step: int | None):
    """Opens `path` to append after its whole records up to resume_step. The records after it (logged by an
    attempt that crashed before its next checkpoint) move to `<name>.dropped`, so nothing logged is lost."""
    if path.exists():
        text = path.read_text()
        # A crash can leave a torn last line; keep whole records only, and none after resume_step.
        steps = [(line, _record_step(line)) for line in text.splitlines()]
        kept = "".join(
            line + "\n"
            for line, step in steps
            if step is not None and (resume_step is None or step <= resume_step)
        )
        dropped = "".join(
            line + "\n"
            for line, step in steps
            if step is not None and resume_step is not None and step > resume_step
        )
        if dropped:
            with open(path.with_name(path.name + ".dropped"), "a") as f:
                f.write(dropped)
        if kept != text:
            path.write_text(kept)
    return open(path, "a")


class _TensorBoard:
    def __init__(self, log_dir: Path, resume_step: int | None, config: dict | None = None):
        from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 - imported only when the backend is on

        purge = None if resume_step is None else resume_step + 1
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge)
        if config is not None:  # TensorBoard's text plugin renders markdown: a code block keeps the layout
            text = json.dumps(config, indent=2, default=str)
            self.writer.add_text(
                "config", "    " + text.replace("\n", "\n    "), global_step=resume_step or 0
            )

    def log(self, metrics: dict, step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def log_samples(self, name: str, columns: list[str], rows: list[dict], step: int) -> None:
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(_markdown_cell(row[c]) for c in columns) + " |" for row in rows]
        self.writer.add_text(name, "\n".join(lines), global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _Wandb:
    def __init__(
        self, project: str, name: str, run_id: str, mode: str, output_dir: Path, config: dict | None
    ):
        import wandb  # imported only when the backend is on

        self.run = wandb.init(
            project=project,
            name=name,
            id=run_id,
            resume="allow",
            mode=wandb_mode(mode),
            dir=str(output_dir),
            config=config,
        )

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(metrics, step=step)

    def log_samples(self, name: str, columns: list[str], rows: list[dict], step: int) -> None:
        import wandb

        table = wandb.Table(columns=columns, data=[[row[c] for c in columns] for row in rows])
        self.run.log({name: table}, step=step)

    def close(self) -> None:
        self.run.finish()


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _markdown_cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", "<br>")


def _json_number(value):
    # JSON has no NaN/inf; null keeps the line valid for every reader.
    return value if not isinstance(value, float) or math.isfinite(value) else None


def _record_step(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"
