"""Tracker: JSONL written and appended on resume, W&B offline run dir, TensorBoard events, rank 0 only."""

import json
import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest

from distflow.tracking import Tracker, wandb_mode


def config(*backends, mode="offline"):
    return SimpleNamespace(project="distflow-test", run_name=None, backends=list(backends), wandb_mode=mode)


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_jsonl_and_resume_appends(tmp_path, capsys):
    with Tracker(config("console", "jsonl"), tmp_path) as t:
        run_id = t.run_id
        for step in (1, 2, 3):
            t.log({"reward/mean": step / 10, "perf/throughput": 100 * step, "actor/grad_norm": 1.0}, step)
            assert len(records(tmp_path)) == step  # flushed at every step
    assert "step 3 | reward/mean 0.3 | perf/throughput 300 (+1 more)" in capsys.readouterr().out
    assert len(run_id) == 8
    # Crash after step 3, resumed from the checkpoint of step 2: step 3 is logged again, once.
    with Tracker(config("jsonl"), tmp_path, run_id=run_id, resume_step=2) as t:
        assert t.run_id == run_id
        t.log({"reward/mean": 0.33}, 3)
        t.log({"reward/mean": 0.4}, 4)
    assert [(r["step"], r["reward/mean"]) for r in records(tmp_path)] == [
        (1, 0.1),
        (2, 0.2),
        (3, 0.33),
        (4, 0.4),
    ]
    # The row the crashed attempt logged after its checkpoint is kept aside, not lost.
    dropped = [json.loads(line) for line in (tmp_path / "metrics.jsonl.dropped").read_text().splitlines()]
    assert [(r["step"], r["reward/mean"]) for r in dropped] == [(3, 0.3)]
    # A crash before the first checkpoint: the fresh run (resume_step 0) starts the file over.
    with Tracker(config("jsonl"), tmp_path, resume_step=0) as t:
        t.log({"reward/mean": 0.5}, 1)
    assert [(r["step"], r["reward/mean"]) for r in records(tmp_path)] == [(1, 0.5)]
    assert len((tmp_path / "metrics.jsonl.dropped").read_text().splitlines()) == 5


def test_torn_line_and_conversions(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n{"step": 2, "rew')
    with Tracker(config("jsonl"), tmp_path) as t:
        t.log({"reward/mean": float("nan"), "data/epoch": True}, 2)
        with pytest.raises(TypeError, match="'reward/name' is str"):
            t.log({"reward/name": "x"}, 3)
    assert records(tmp_path) == [
        {"step": 1, "reward/mean": 0.5},
        {**records(tmp_path)[1], "step": 2, "reward/mean": None, "data/epoch": 1},
    ]


def test_other_ranks_do_nothing(tmp_path):
    t = Tracker(config("console", "jsonl", "wandb"), tmp_path / "run", rank=1, run_id="abc")
    t.log({"reward/mean": 1.0}, 1)
    t.close()
    assert t.run_id == "abc" and not (tmp_path / "run").exists()


def test_wandb_offline_run_dir_and_resume(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    assert wandb_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode("auto") == "online" and wandb_mode("offline") == "offline"
    # As after a resume: the run id comes from the checkpoint and W&B continues that run (resume="allow").
    with Tracker(
        config("wandb", mode="offline"), tmp_path, run_id="resumed1", resume_step=4, config={"lr": 1e-6}
    ) as t:
        t.log({"reward/mean": 0.5}, 5)
        assert t.run_id == "resumed1"
    runs = list((tmp_path / "wandb").glob("offline-run-*-resumed1"))
    assert len(runs) == 1 and (runs[0] / "run-resumed1.wandb").stat().st_size > 0


def test_tensorboard_events(tmp_path):
    pytest.importorskip("tensorboard")
    with Tracker(config("tensorboard"), tmp_path) as t:
        t.log({"reward/mean": 0.5}, 1)
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_plot_metrics(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    with Tracker(config("jsonl"), tmp_path) as t:
        for step in range(1, 6):
            t.log(
                {
                    "reward/mean": step / 5,
                    "val/reward/mean": step / 6,
                    "val/openai/gsm8k/reward/mean": step / 7,
                    "val/openai/gsm8k/accuracy": step / 10,
                    "rollout/response_length/mean": 10.0 + step,
                    "rollout/response_length/max": 20,
                    "actor/kl_loss": 0.01 * step,
                    "actor/entropy": 2.0 - step / 10,
                    "perf/throughput": 1e3,
                },
                step,
            )
    main = runpy.run_path(str(Path(__file__).parents[2] / "tools" / "plot_metrics.py"))["main"]
    written = main([str(tmp_path)])
    assert sorted(p.name for p in written) == [
        "accuracy.png",
        "entropy.png",
        "kl.png",
        "response_length.png",
        "reward.png",
        "throughput.png",
    ]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in written)
    assert str(tmp_path / "plots" / "reward.png") in capsys.readouterr().out


def test_console_shows_progress_and_time_left(tmp_path, capsys, monkeypatch):
    import distflow.tracking.tracker as tracker_module

    clock = iter([100.0, 110.0, 120.0])  # the first step is logged at t=100, then one step per 10 s
    monkeypatch.setattr(tracker_module.time, "monotonic", lambda: next(clock))
    with Tracker(config("console"), tmp_path, total_steps=40) as t:
        for step in (1, 2, 3):
            t.log({"reward/mean": 0.5}, step)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("step 1/40 (2%) | reward/mean 0.5")
    assert lines[2].startswith("step 3/40 (8%, ~6m10s left) |"), lines  # 37 steps x 10 s


def test_verl_metric_names(tmp_path, capsys):
    cfg = config("console", "jsonl")
    cfg.metric_names = "verl"
    with Tracker(cfg, tmp_path) as t:
        t.log(
            {
                "reward/mean": 0.5,
                "reward/max": 1.0,
                "reward/shaped/mean": 0.4,
                "advantage/min": -1.0,
                "rollout/response_length/clip_ratio": 0.1,
                "rollout/prompt_length/mean": 12.0,
                "timing_s/generate": 2.0,
                "timing_s/train_actor": 3.0,
                "timing_s/step": 6.0,
                "actor/pg_clipfrac": 0.2,
                "val/openai/gsm8k/reward/mean": 0.3,
            },
            1,
        )
    (row,) = records(tmp_path)
    assert {k: v for k, v in row.items() if k != "time"} == {
        "step": 1,
        "critic/score/mean": 0.5,
        "critic/score/max": 1.0,
        "critic/rewards/mean": 0.4,
        "critic/advantages/min": -1.0,
        "response_length/clip_ratio": 0.1,
        "prompt_length/mean": 12.0,
        "timing_s/gen": 2.0,
        "timing_s/update_actor": 3.0,
        "timing_s/step": 6.0,
        "actor/pg_clipfrac": 0.2,
        "val/openai/gsm8k/reward/mean": 0.3,
    }
    assert "critic/score/mean 0.5" in capsys.readouterr().out  # the console follows the scheme
    cfg.metric_names = "megatron"
    with pytest.raises(ValueError, match="metric_names='megatron'; choose from distflow, verl"):
        Tracker(cfg, tmp_path / "other")


def test_samples_table_in_jsonl_and_wandb(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": "1+1?",
            "response": "2",
            "ground_truth": "2",
            "reward": 1.0,
        },
        {"data_source": "copy", "prompt": "abc", "response": "ab|c\nd", "ground_truth": "abc", "reward": 0.0},
    ]
    with Tracker(config("jsonl", "wandb"), tmp_path, run_id="tables01") as t:
        t.log_samples(rows, 1)
        t.log({"val/reward/mean": 0.5}, 1)
        with pytest.raises(ValueError, match="every row needs the columns"):
            t.log_samples([rows[0], {"prompt": "x"}], 2)
    lines = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert lines == [{"step": 1, "table": "val/samples", **row} for row in rows]
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*-tables01")
    tables = list(run_dir.rglob("media/table/val/samples_*.table.json"))
    assert tables, sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))
    table = json.loads(tables[0].read_text())
    assert table["columns"] == list(rows[0]) and table["data"][1][2] == "ab|c\nd"


def test_tensorboard_config_and_samples_text(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with Tracker(config("tensorboard"), tmp_path, config={"actor": {"optim": {"lr": 1e-6}}}) as t:
        t.log_samples([{"prompt": "p", "response": "a|b", "reward": 1.0}], 1)
        t.log({"reward/mean": 0.5}, 1)
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0}).Reload()
    text = {
        tag: events.Tensors(tag)[0].tensor_proto.string_val[0].decode() for tag in events.Tags()["tensors"]
    }
    assert '"lr": 1e-06' in text["config/text_summary"]
    assert "| p | a\\|b | 1.0 |" in text["val/samples/text_summary"]
