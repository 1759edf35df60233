"""An RL checkpoint becomes a Hugging Face model, and a role starts from a Megatron dist checkpoint (<role>.load).

Real MegatronWorkers at TP=2 (gloo, 2 CPU processes) train 2 steps and save step_2 through the Checkpointer,
then export the actor as the trainer's final export does (RUN_DIR/hf). tools/convert_megatron_to_hf.py (its
main, every run in one process) on step_2/actor, on step_2 and on checkpoints/latest writes the same bytes as
that export; a checkpoint without its recorded HF source is refused naming --hf-config, and exports with it.
A fresh actor with actor.load=step_2 holds the trained weights, a critic with critic.load=step_2/actor the
actor's body and a fresh value head, and a model.path of another shape is refused naming the tensors.
"""

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from distflow.checkpointing import CheckpointError
from distflow.checkpointing.model_folder import resolve_model_folder
from distflow.models.checkpoint_import import HF_ASSETS_DIR, SOURCE_FILE
from distflow.models.tiny import make_tiny_model
from distflow.testing.launch import run, torchrun

JOB = Path(__file__).parent / "jobs" / "checkpoint_job.py"
# tools/convert_megatron_to_hf.py's main, once per argument list, in one process
EXPORT_RUNS_JOB = Path(__file__).parents[1] / "models" / "jobs" / "export_tool_runs.py"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("rl_export")
    model = make_tiny_model("qwen2", root / "tiny", vocab=300)
    other = make_tiny_model("qwen2", root / "wider", vocab=300, hidden=96)
    run_dir = root / "run"
    run_dir.mkdir()
    torchrun(JOB, nproc=2, args=["--model", model, "--dir", run_dir, "--tp", 2, "export"], timeout_s=300)
    return model, other, run_dir


EXPORTS = {
    "role": "step_2/actor",
    "step": "step_2",
    "latest": "latest",
    "root": ".",
}  # id: what --megatron names


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory) -> dict:
    """The tool's runs, all in one process (its start-up is most of a run's cost): id -> (result, out dir) for
    each of EXPORTS (with --verify), and "refused" / "with_hf_config" on a copy of step_2 whose actor lacks its
    recorded HF source, as DistFlow wrote it before the source was recorded, without and with --hf-config."""
    model, _, run_dir = trained
    root = tmp_path_factory.mktemp("exports")
    old = root / "checkpoints" / "step_2"
    shutil.copytree(run_dir / "checkpoints" / "step_2", old)
    (old / "actor" / SOURCE_FILE).unlink()
    shutil.rmtree(old / "actor" / HF_ASSETS_DIR)
    runs = {
        given: (run_dir / "checkpoints" / path, root / given, "--verify") for given, path in EXPORTS.items()
    }
    runs["refused"] = (old, root / "refused")
    runs["with_hf_config"] = (old, root / "with_hf_config", "--hf-config", model)
    argv = [
        ["--megatron", source, "--out", out, "--no-progress", *extra] for source, out, *extra in runs.values()
    ]
    (root / "runs.json").write_text(json.dumps([[str(a) for a in args] for args in argv]))
    run([sys.executable, EXPORT_RUNS_JOB, root / "results.json", root / "runs.json"], timeout_s=300)
    results = json.loads((root / "results.json").read_text())
    return {name: (result, out) for (name, (_, out, *_)), result in zip(runs.items(), results)}


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_rl_checkpoint_records_its_hf_source(trained):
    model, _, run_dir = trained
    actor = run_dir / "checkpoints" / "step_2" / "actor"
    source = json.loads((actor / SOURCE_FILE).read_text())
    assert source["hf_config"] == json.loads((model / "config.json").read_text())
    assert source["distflow_role"] == "actor" and source["distflow_step"] == 2 and not source["value_head"]
    assert (actor / HF_ASSETS_DIR / "tokenizer.json").read_bytes() == (model / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("given", list(EXPORTS))
def test_export_of_a_step_equals_the_trainers_final_export(trained, exported, given):
    _, _, run_dir = trained
    result, out = exported[given]
    assert result["returncode"] == 0, result["stderr"]
    assert "verify: every tensor equals the checkpoint's" in result["stdout"]
    assert _files(out) == _files(run_dir / "hf")  # bit for bit: weights, config, tokenizer


def test_checkpoint_without_recorded_source_needs_hf_config(trained, exported):
    _, _, run_dir = trained
    refused, _ = exported["refused"]
    assert refused["returncode"] == 2
    assert (
        "before DistFlow recorded its HF source" in refused["stderr"] and "--hf-config" in refused["stderr"]
    )
    assert refused["stderr"].count("\n") == 1, refused["stderr"]  # one line, no traceback
    ok, out = exported["with_hf_config"]
    assert ok["returncode"] == 0, ok["stderr"]
    assert _files(out) == _files(run_dir / "hf")


def test_resolve_names_what_a_folder_lacks(trained, tmp_path):
    _, _, run_dir = trained
    with pytest.raises(CheckpointError, match="holds no critic model .*'actor'"):
        resolve_model_folder(run_dir / "checkpoints" / "step_2", "critic")
    with pytest.raises(CheckpointError, match="not a Megatron dist checkpoint"):
        resolve_model_folder(tmp_path, "actor")
    # a reference without its own folder starts from the actor's weights
    assert (
        resolve_model_folder(run_dir / "checkpoints", "ref") == run_dir / "checkpoints" / "step_2" / "actor"
    )


def test_roles_start_from_a_dist_checkpoint(trained):
    model, other, run_dir = trained
    torchrun(
        JOB,
        nproc=2,
        timeout_s=300,
        args=["--model", model, "--dir", run_dir, "--tp", 2, "--other-model", other, "load"],
    )
    loaded = torch.load(run_dir / "load.pt", weights_only=False)
    trained_weights = torch.load(run_dir / "export.pt", weights_only=False)["weights"]
    assert loaded["loaded_from"] == str(run_dir / "checkpoints" / "step_2" / "actor")
    initial = dict(_load_safetensors(model))
    changed = 0
    for name, tensor in trained_weights.items():
        assert torch.equal(loaded["weights"][name], tensor), name
        changed += not torch.equal(tensor, initial[name])
    assert changed, "the training steps changed no weight: the test would not see a load from model.path"
    critic = loaded["critic_weights"]
    assert "lm_head.weight" not in critic
    assert all(torch.equal(critic[n], trained_weights[n]) for n in critic), "critic body != the actor's"
    assert (
        "actor.load=" in loaded["mismatch"]
        and "was made from another model than model.path" in loaded["mismatch"]
    )
    assert "hidden_size=64 (model.path: 96)" in loaded["mismatch"], loaded["mismatch"]
    shapes = loaded["shape_mismatch"]  # no recorded config: the tensors' shapes are compared
    assert (
        "does not hold the model of model.path" in shapes and "embedding.word_embeddings.weight" in shapes
    ), shapes


def _load_safetensors(model_dir: Path):
    from safetensors.torch import load_file

    return load_file(model_dir / "model.safetensors").items()
