"""The verl -> DistFlow key map: every target is a real DistFlow key, the doc is the table, and the CLI
prints it."""

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

from distflow.config.schema import DistFlowConfig
from distflow.config.verl_keys import VERL_KEYS, explain, render_markdown

REPO_ROOT = Path(__file__).resolve().parents[2]


def _distflow_keys(cls=DistFlowConfig, prefix="") -> set[str]:
    keys = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        keys.add(prefix + f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            keys |= _distflow_keys(hints[f.name], f"{prefix}{f.name}.")
    return keys


def test_every_target_is_a_distflow_key():
    valid = _distflow_keys()
    wrong = {k: v.target for k, v in VERL_KEYS.items() if v.target and v.target not in valid}
    assert not wrong, wrong


def test_common_verl_keys_are_mapped():
    assert VERL_KEYS["data.max_response_length"].target == "rollout.max_new_tokens"
    assert VERL_KEYS["actor_rollout_ref.rollout.tensor_model_parallel_size"].target == "rollout.engine_tp"
    assert VERL_KEYS["actor_rollout_ref.actor.megatron.tensor_model_parallel_size"].target == "actor.tp"
    assert VERL_KEYS["trainer.save_freq"].target == "checkpoint.save_every"
    assert explain("+trainer.test_freq") == "in DistFlow this is trainer.val_every"
    assert explain("trainer.nnodes").startswith("DistFlow has no such key")
    assert explain("data.not_a_verl_key") is None


def test_doc_matches_the_table():
    doc = (REPO_ROOT / "docs" / "verl_key_map.md").read_text()
    assert doc == render_markdown(), (
        "docs/verl_key_map.md is stale: regenerate it with "
        "python -m distflow.config verl-keys --markdown > docs/verl_key_map.md"
    )


def test_cli_prints_the_table():
    out = subprocess.run(
        [sys.executable, "-m", "distflow.config", "verl-keys"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("data.max_response_length "))
    assert line.split()[1] == "rollout.max_new_tokens"
    assert len(out.stdout.splitlines()) == len(VERL_KEYS)


def test_docs_command_lists_the_choices_of_choice_fields():
    out = subprocess.run(
        [sys.executable, "-m", "distflow.config", "docs"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "trainer.device (one of: auto, cpu, cuda," in out.stdout
    assert "actor.recompute_granularity (one of: full, selective, or null," in out.stdout
