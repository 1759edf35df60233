"""A bad input stops `distflow.train` within seconds, before Megatron, SGLang or process groups: one line
`distflow.train: error: ...` from rank 0, the other ranks quiet, exit code 2."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distflow.data.preparation import schema_row
from distflow.models.tiny import make_tiny_model

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG = "examples/configs/grpo_copy_cpu.yaml"


@pytest.fixture(scope="module")
def run_args(tmp_path_factory) -> list[str]:
    tmp = tmp_path_factory.mktemp("early")
    model = make_tiny_model("qwen2", tmp / "model", vocab=300)
    rows = [schema_row("1234", "1234", "distflow/copy", "train", i, "copy") for i in range(8)]
    pq.write_table(pa.Table.from_pylist(rows), tmp / "train.parquet")
    return [
        CONFIG,
        f"model.path={model}",
        f"data.train_files={tmp / 'train.parquet'}",
        "data.val_files=[]",
        f"trainer.output_dir={tmp / 'out'}",
    ]


def _launch(cmd: list) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    start = time.perf_counter()
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    return proc, time.perf_counter() - start


def test_reward_name_typo_under_torchrun_fails_in_seconds_with_one_line(run_args):
    proc, seconds = _launch(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "-m",
            "distflow.train",
            *run_args,
            "reward.name=gsm8kk",
        ]
    )
    ours = [line for line in proc.stderr.splitlines() if line.startswith("distflow.train:")]
    assert ours == [ours[0]] and ours[0].startswith(
        "distflow.train: error: unknown reward.name 'gsm8kk' (did you mean gsm8k?)"
    ), proc.stderr[-3000:]
    # torchrun reports its failed children itself (its own summary, exit code 1); the ranks exited with 2
    # and printed no traceback of their own.
    assert proc.returncode != 0 and "exitcode: 2" in proc.stderr, proc.stderr[-3000:]
    assert not [
        line for line in proc.stderr.splitlines() if line.strip().startswith("File ") and "distflow" in line
    ]
    assert seconds < 30, f"took {seconds:.1f} s"


def test_missing_data_file_single_rank_is_one_line_and_exit_2(run_args, tmp_path):
    proc, seconds = _launch(
        [
            sys.executable,
            "-m",
            "distflow.train",
            *run_args,
            "actor.tp=1",
            f"data.train_files={tmp_path / 'missing.parquet'}",
        ]
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [
        f"distflow.train: error: data.train_files[0]={tmp_path / 'missing.parquet'}: no such file"
    ], proc.stderr[-3000:]
    assert seconds < 30, f"took {seconds:.1f} s"


def test_other_ranks_wait_for_rank_0_and_stay_quiet(run_args):
    """A rank other than 0 prints nothing within the grace period in which torchrun stops it once rank 0 has
    exited with the same error (an error only that rank has is named after it, with the rank)."""
    env_rank1 = {**os.environ, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "distflow.train", *run_args, "actor.optim.lr=-1"],
        cwd=REPO_ROOT,
        env=env_rank1,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=8)  # validation takes under a second here; the grace period is 10 s
    finally:
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert stderr.splitlines() == [
        "distflow.train: error: [rank 1] actor.optim.lr=-1.0 must be > 0 (and finite)"
    ]
