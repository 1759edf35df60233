"""The checkpoints folder without processes: commit by rename, atomic `latest`, pruning, resume lookup and the
errors for resume sources that cannot be used (missing, not a checkpoint, another run's layout or model)."""

import json
from types import SimpleNamespace

import pytest

from distflow.checkpointing import CheckpointDirectory, Checkpointer, CheckpointError, resolve_resume
from distflow.checkpointing.trainer_state import FORMAT, FORMAT_VERSION, check_compatible, read_meta


def fake_save(directory: CheckpointDirectory, step: int, keep_last: int = 2, commit: bool = True):
    """What Checkpointer.save does on the file system, without the shards."""
    staging = directory.prepare_staging(step)
    (staging / "rank_0.pt").write_bytes(b"x")
    (staging / "meta.json").write_text(
        json.dumps({"format": FORMAT, "format_version": FORMAT_VERSION, "step": step})
    )
    if commit:
        directory.commit(step, keep_last)


def test_commit_points_latest_and_prunes(tmp_path):
    d = CheckpointDirectory.of_run(tmp_path)
    assert resolve_resume("auto", tmp_path) is None  # nothing yet: a fresh run
    for step in (2, 4, 6):
        fake_save(d, step)
        assert d.latest() == d.final(step)
        assert not d.staging(step).exists()
    assert d.complete_steps() == [4, 6]  # keep_last=2
    assert resolve_resume("auto", tmp_path) == d.final(6)
    assert not list(tmp_path.glob("checkpoints/.latest*"))  # the temp pointer was renamed away


def test_an_interrupted_save_changes_nothing(tmp_path):
    d = CheckpointDirectory.of_run(tmp_path)
    fake_save(d, 2)
    fake_save(d, 4, commit=False)  # died before the rename
    assert d.latest() == d.final(2) and d.complete_steps() == [2]
    assert resolve_resume("auto", tmp_path) == d.final(2)
    fake_save(d, 4)  # the retry replaces the leftovers
    assert d.latest() == d.final(4)


def test_resume_sources(tmp_path):
    d = CheckpointDirectory.of_run(tmp_path / "run")
    fake_save(d, 3)
    assert resolve_resume(str(d.final(3)), tmp_path / "other") == d.final(3)  # a step folder
    assert resolve_resume(str(d.root), tmp_path / "other") == d.final(3)  # a checkpoints folder
    assert resolve_resume("never", tmp_path / "other") is None


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda p: None, "no such file or folder.*expected auto, never, a step_<N> checkpoint folder"),
        (lambda p: p.mkdir(), "is not a DistFlow checkpoint: it has no meta.json"),
        (
            lambda p: (p.mkdir(), (p / "latest").write_text("step_9\n")),
            "names 'step_9', which is not a complete",
        ),
    ],
)
def test_bad_resume_paths_name_the_path(tmp_path, make, match):
    path = tmp_path / "ckpt"
    make(path)
    with pytest.raises(CheckpointError, match=match) as err:
        resolve_resume(str(path), tmp_path / "run")
    assert str(path) in str(err.value)


def test_never_refuses_to_overwrite_checkpoints(tmp_path):
    fake_save(CheckpointDirectory.of_run(tmp_path), 2)
    with pytest.raises(
        CheckpointError, match=r"resume=never but .*checkpoints already holds checkpoints \[2\]"
    ):
        resolve_resume("never", tmp_path)


def test_bad_settings_and_meta(tmp_path):
    cfg = SimpleNamespace(save_every=1, keep_last=0, resume="auto")
    with pytest.raises(CheckpointError, match="keep_last=0"):
        Checkpointer(cfg, tmp_path, 0, 1)
    step = tmp_path / "step_1"
    step.mkdir()
    (step / "meta.json").write_text('{"format": "something-else", "format_version": 1}')
    with pytest.raises(
        CheckpointError, match="format 'something-else'.*expected 'distflow-training-checkpoint'"
    ):
        read_meta(step)
    (step / "meta.json").write_text("{torn")
    with pytest.raises(CheckpointError, match="unreadable"):
        read_meta(step)


def run_description(tp=2, dp=1, hidden=64, roles=("actor",), world=2):
    layout = dict(tp=tp, pp=1, dp=dp, cp=1, vpp=1, ep=1, etp=tp)
    model = dict(architectures=["Qwen2ForCausalLM"], hidden_size=hidden, num_hidden_layers=2, vocab_size=300)
    return {"world_size": world, "roles": {r: {"layout": layout, "model": model} for r in roles}}


def test_another_layout_or_model_is_refused(tmp_path):
    saved = run_description()
    check_compatible(tmp_path, saved, run_description())  # the same run: fine
    with pytest.raises(
        CheckpointError, match=r"actor layout: dp=1 \(now 2\), etp=2 \(now 1\), tp=2 \(now 1\)"
    ) as err:
        check_compatible(tmp_path, saved, run_description(tp=1, dp=2))
    assert str(tmp_path) in str(err.value)
    with pytest.raises(CheckpointError, match=r"actor model: hidden_size=64 \(now 128\)"):
        check_compatible(tmp_path, saved, run_description(hidden=128))
    with pytest.raises(
        CheckpointError,
        match=r"world size 2 \(now 4\).*trainable roles \['actor'\] \(now \['actor', "
        r"'critic'\]\)",
    ):
        check_compatible(tmp_path, saved, run_description(roles=("actor", "critic"), world=4))
