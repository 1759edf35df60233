"""The toy task the end-to-end tests train on: a tiny qwen2 model and copy-task parquet files ("1234" ->
"1234"), made locally, plus reading back a run's metrics."""

import json
import sys
from pathlib import Path

from distflow.models.tiny import make_tiny_model
from distflow.testing.launch import run


def copy_task(root, *, train: int, test: int = 8, family: str = "qwen2", **sizes) -> tuple[Path, Path]:
    """(model dir, data dir) under `root`: a tiny `family` model (qwen2 unless given) with a 300-token
    vocabulary (padded for TP, which exercises the masking of padded logits; `sizes` as make_tiny_model's,
    e.g. the README main job's hidden=128, ffn=512) and `train`/`test` copy prompts of 4 digits (seed 1)."""
    root = Path(root)
    model = make_tiny_model(family, root / f"tiny-{family}", vocab=300, **sizes)
    data = root / "copy"
    run(
        [
            sys.executable,
            "tools/prepare_data.py",
            "copy",
            "--out",
            data,
            "--digits",
            "4",
            "--train",
            str(train),
            "--test",
            str(test),
            "--seed",
            "1",
        ],
        timeout_s=300,
    )
    return model, data


def metrics_rows(out_dir) -> list[dict]:
    """The JSONL metrics a run wrote to <trainer.output_dir>/metrics.jsonl, one dict per step."""
    return [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]


# Metrics that differ between two runs computing the same steps: wall-clock time, and scheduling outcomes
# (which engine generated which chunk, restarts); samples, rewards, losses and weights may not.
TIMED_METRICS = (
    "timing_s/",
    "perf/",
    "sync/seconds",
    "sync/gbps",
    "sync/phase_s/",
    "rollout/seconds",
    "rollout/stolen_groups",
    "rollout/engine_tokens_max_over_mean",
    "rollout/engine_restarts",
    "trainer/restarts",
)


def comparable_metrics(row: dict) -> dict:
    """A metrics row without its timing and scheduling metrics (TIMED_METRICS), step and time."""
    return {k: v for k, v in row.items() if k not in ("step", "time") and not k.startswith(TIMED_METRICS)}


def copy_job_args(model, data, out_dir=None) -> list[str]:
    """distflow.train's arguments for the README's main job on the copy task in `data`, training only (no
    validation), writing to out_dir (None: the caller names it): the base the tools' benchmark jobs and the
    tests add their own overrides to."""
    return [
        "examples/configs/grpo_copy_cpu.yaml",
        f"model.path={model}",
        f"data.train_files=[{data}/train.parquet]",
        "data.val_files=[]",
        "trainer.val_every=0",
        *([f"trainer.output_dir={out_dir}"] if out_dir is not None else []),
    ]


def small_test_job_args(model, data, out_dir=None) -> list[str]:
    """distflow.train's arguments for the small jobs of the tests, before each test's own: the main job's
    shape (2 ranks, actor TP=2, an engine each) on 4 prompts x 4 samples of at most 6 tokens, one warm-up
    step, no validation, no HF export."""
    return [
        *copy_job_args(model, data, out_dir),
        "trainer.sft_warmup_steps=1",
        "data.train_batch_size=4",
        "rollout.n=4",
        "rollout.max_new_tokens=6",
        "checkpoint.export_hf=false",
    ]


def disaggregated_test_job_args(model, data) -> list[str]:
    """small_test_job_args, disaggregated: one training rank, one engine rank."""
    return [
        *small_test_job_args(model, data),
        "rollout.placement=disaggregated",
        "rollout.num_ranks=1",
        "actor.tp=1",
    ]
