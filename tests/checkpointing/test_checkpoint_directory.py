"""The checkpoints folder without processes: commit by rename, atomic `latest`, pruning, resume lookup, the
manifest that tells an intact checkpoint from a damaged one, and the errors for resume sources that cannot be
used (missing, not a checkpoint, damaged, another run's layout or model)."""

import json
import logging
from types import SimpleNamespace

import pytest

from distflow.checkpointing import (
    CheckpointDirectory,
    Checkpointer,
    CheckpointError,
    manifest,
    resolve_resume,
)
from distflow.checkpointing.trainer_state import FORMAT, FORMAT_VERSION, check_compatible, read_meta


def fake_save(directory: CheckpointDirectory, step: int, keep_last: int = 2, commit: bool = True):
    """What Checkpointer.save does on the file system, without the shards."""
    staging = directory.prepare_staging(step)
    (staging / "rank_0.pt").write_bytes(b"x")
    (staging / "actor").mkdir()
    (staging / "actor" / "__0_0.distcp").write_bytes(bytes(range(256)) * 4)
    (staging / "meta.json").write_text(
        json.dumps({"format": FORMAT, "format_version": FORMAT_VERSION, "step": step})
    )
    manifest.write(staging, manifest.describe(staging, checksums=True))
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


def _shard(d: CheckpointDirectory, step: int):
    return d.final(step) / "actor" / "__0_0.distcp"


def test_auto_skips_a_damaged_latest_step_loudly(tmp_path, caplog):
    d = CheckpointDirectory.of_run(tmp_path)
    for step in (2, 4):
        fake_save(d, step)
    data = _shard(d, 4).read_bytes()
    _shard(d, 4).write_bytes(data[:100])  # truncated
    with caplog.at_level(logging.WARNING):
        assert resolve_resume("auto", tmp_path) == d.final(2)
    assert (
        "resuming from" in caplog.text
        and "step_4 is damaged" in caplog.text
        and "has 100 bytes" in caplog.text
    )
    # Named explicitly, the damaged step is refused with the file and the intact one beside it.
    with pytest.raises(
        CheckpointError, match=r"__0_0.distcp has 100 bytes, the manifest 1024.*beside it: step_2"
    ):
        resolve_resume(str(d.final(4)), tmp_path / "other")


def test_a_flipped_byte_is_found_by_the_checksums_only(tmp_path):
    d = CheckpointDirectory.of_run(tmp_path)
    fake_save(d, 2)
    data = bytearray(_shard(d, 2).read_bytes())
    data[7] ^= 1
    _shard(d, 2).write_bytes(bytes(data))
    assert manifest.check(d.final(2), checksums=False) == []
    assert manifest.check(d.final(2), checksums=True) == [
        f"{_shard(d, 2)} does not match its checksum (damaged)"
    ]
    checkpointer = SimpleNamespace(cfg=SimpleNamespace(checksums=True))
    with pytest.raises(CheckpointError, match="no intact checkpoint .* will not start over"):
        resolve_resume("auto", tmp_path, check=lambda f: Checkpointer._problems(checkpointer, f))


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda f: (f / "actor" / "__0_0.distcp").unlink(), "__0_0.distcp is missing"),
        (lambda f: (f / "actor" / "extra.distcp").write_bytes(b"?"), "extra.distcp is not in the manifest"),
        (lambda f: (f / "manifest.json").write_text("{"), "manifest.json is unreadable"),
        (lambda f: (f / "meta.json").unlink(), "no meta.json"),
    ],
)
def test_every_damage_is_named(tmp_path, damage, problem):
    d = CheckpointDirectory.of_run(tmp_path)
    fake_save(d, 2)
    damage(d.final(2))
    with pytest.raises(CheckpointError, match=r"no intact checkpoint .*" + problem.replace(".", r"\.")):
        resolve_resume("auto", tmp_path)


def test_a_missing_latest_never_starts_the_run_over(tmp_path, caplog):
    d = CheckpointDirectory.of_run(tmp_path)
    for step in (2, 4):
        fake_save(d, step)
    (d.root / "latest").unlink()  # a crash between the rename and `latest`, or a user's mistake
    with caplog.at_level(logging.WARNING):
        assert resolve_resume("auto", tmp_path) == d.final(4)
    assert "`latest` names None" in caplog.text


def test_a_checkpoint_from_before_manifests_still_resumes(tmp_path, caplog):
    d = CheckpointDirectory.of_run(tmp_path)
    fake_save(d, 2)
    (d.final(2) / "manifest.json").unlink()
    with caplog.at_level(logging.WARNING):
        assert resolve_resume("auto", tmp_path) == d.final(2)
    assert "has no manifest.json (an older DistFlow wrote it): not verified" in caplog.text


def test_saving_a_step_again_keeps_an_intact_folder_and_moves_a_damaged_one_aside(tmp_path):
    d = CheckpointDirectory.of_run(tmp_path)
    fake_save(d, 2)
    fake_save(d, 4)
    (d.root / "latest").write_text("step_2\n")  # as after a crash between the rename and `latest`
    with pytest.raises(CheckpointError, match="step_4 exists and is a complete checkpoint; refusing"):
        fake_save(d, 4)
    _shard(d, 4).write_bytes(b"")
    fake_save(d, 4)
    assert d.latest() == d.final(4) and manifest.check(d.final(4), checksums=True) == []
    assert (d.root / ".damaged_step_4" / "actor" / "__0_0.distcp").read_bytes() == b""
