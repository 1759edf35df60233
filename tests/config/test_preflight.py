"""Every check before the heavy start: each class of bad input is answered by config validation or the
pre-flight (distflow.preflight) with a message naming the field or file and what would be valid, and
none of them imports Megatron, SGLang or a model's code.

All cases run in one subprocess (tests/config/jobs/preflight_cases.py) so that its sys.modules tells what
the checks imported and the imports are paid once.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from distflow.data.preparation import schema_row

JOB = Path(__file__).parent / "jobs" / "preflight_cases.py"
REPO_ROOT = Path(__file__).resolve().parents[2]

# case: (overrides, substrings the error must contain; None: the checks pass)
CASES = {
    "good": ([], None),
    "negative_lr": (["actor.optim.lr=-1e-3"], ["actor.optim.lr=-0.001", "must be > 0"]),
    "critic_lr_zero": (["critic.optim.lr=0"], ["critic.optim.lr=0.0", "must be > 0"]),
    "min_lr_above_lr": (
        ["actor.optim.min_lr=1"],
        ["actor.optim.min_lr=1.0", "must be in [0, actor.optim.lr="],
    ),
    "negative_clip_grad": (["actor.optim.clip_grad=-1"], ["actor.optim.clip_grad=-1.0", ">= 0"]),
    "adam_beta_one": (["actor.optim.adam_beta2=1"], ["actor.optim.adam_beta2=1.0", "[0, 1)"]),
    "negative_kl": (["algorithm.kl_coef=-0.1"], ["algorithm.kl_coef=-0.1", ">= 0"]),
    "clip_low_one": (["algorithm.clip_ratio_low=1"], ["algorithm.clip_ratio_low=1.0", "(0, 1)"]),
    "clip_c_below_one": (["algorithm.clip_ratio_c=0.5"], ["algorithm.clip_ratio_c=0.5", "> 1"]),
    "gamma_above_one": (["algorithm.gamma=1.5"], ["algorithm.gamma=1.5", "[0, 1]"]),
    "zero_steps": (["trainer.total_steps=0"], ["trainer.total_steps=0", ">= 1"]),
    "keep_last_zero": (["checkpoint.keep_last=0"], ["checkpoint.keep_last=0", ">= 1"]),
    "reward_timeout_zero": (["reward.timeout_s=0"], ["reward.timeout_s=0.0", "> 0"]),
    "mini_batch_not_divisor": (
        ["actor.mini_batch_size=3"],
        ["actor.mini_batch_size=3", "divide data.train_batch_size=8"],
    ),
    "device_gpu": (["trainer.device=gpu"], ["trainer.device='gpu'", "did you mean 'cuda'?"]),
    "verl_key": (
        ["data.max_response_length=256"],
        ["data.max_response_length", "in DistFlow this is rollout.max_new_tokens"],
    ),
    "verl_nested_key": (["actor_rollout_ref.rollout.n=4"], ["actor_rollout_ref.rollout.n", "rollout.n"]),
    "reward_name_typo": (
        ["reward.name=gsm8kk"],
        ["unknown reward.name 'gsm8kk'", "did you mean gsm8k?", "auto"],
    ),
    "reward_custom_missing_module": (
        ["reward.custom=no_such_module_x:score"],
        ["reward.custom=", "no_such_module_x"],
    ),
    "reward_custom_missing_file": (
        ["reward.custom=missing_dir/scorer.py:score"],
        ["reward.custom=", "no such file", "missing_dir/scorer.py"],
    ),
    "reward_custom_bad_contract": (
        ["reward.custom={tmp}/scorers.py:two_args"],
        ["reward.custom=", "two_args", "solution_str"],
    ),
    "reward_custom_file_ok": (["reward.custom={tmp}/scorers.py:score"], None),
    "auto_unknown_data_source": (
        ["reward.name=auto", "data.train_files={tmp}/other_source.parquet"],
        ["data.train_files", "no scorer for data_source 'my/source'"],
    ),
    "missing_data_file": (
        ["data.train_files=[{tmp}/missing.parquet]"],
        ["data.train_files[0]", "missing.parquet", "no such file"],
    ),
    "empty_data_file": (
        ["data.train_files={tmp}/empty.parquet"],
        ["data.train_files", "empty.parquet", "empty"],
    ),
    "missing_column": (
        ["data.train_files={tmp}/nocol.parquet"],
        ["nocol.parquet", "missing field 'reward_model'"],
    ),
    "all_prompts_too_long": (
        ["data.max_prompt_length=3"],
        ["data.max_prompt_length=3", "set data.max_prompt_length="],
    ),
    "no_train_files": (["data.train_files=[]"], ["data.train_files is empty"]),
    "jsonl_accepted": (["data.train_files={tmp}/train.jsonl"], None),
    "single_path_is_a_list": (["data.train_files={tmp}/train.parquet"], None),
    "model_path_missing": (["model.path={tmp}/no_model"], ["model.path=", "no_model", "no such directory"]),
    "model_path_no_config": (["model.path={tmp}"], ["model.path=", "no config.json"]),
    "reward_model_missing": (["reward.model_path={tmp}/no_rm"], ["reward.model_path=", "no_rm"]),
    "actor_load_missing": (["actor.load={tmp}/no_ckpt"], ["actor.load=", "no_ckpt"]),
    "resume_missing": (["checkpoint.resume={tmp}/no_ckpt"], ["checkpoint.resume=", "no_ckpt"]),
    "pipeline_typo": (["dag.pipeline=grop"], ["dag.pipeline='grop'", "did you mean grpo?"]),
    "pipeline_estimator": (
        ["dag.pipeline=rloo", "algorithm.adv_estimator=grpo"],
        ["dag.pipeline=rloo", "adv_estimator"],
    ),
    "kl_without_ref": (
        ["algorithm.kl_coef=0.1", "ref.enable=false"],
        ["algorithm.kl_coef=0.1", "ref.enable=true"],
    ),
    "dapo_with_reward_model": (
        ["dag.pipeline=dapo", "reward.model_path={model}"],
        ["reward.model_path", "dag.pipeline=dapo"],
    ),
    "dynamic_sampling_without_dapo": (
        ["algorithm.dynamic_sampling=true"],
        ["algorithm.dynamic_sampling=true", "dag.pipeline=dapo"],
    ),
    "overlong_buffer_too_long": (
        ["dag.pipeline=dapo", "algorithm.overlong_buffer_len=100"],
        ["algorithm.overlong_buffer_len=100", "rollout.max_new_tokens=8"],
    ),
    "output_dir_is_a_file": (
        ["trainer.output_dir={tmp}/train.jsonl"],
        ["trainer.output_dir=", "train.jsonl is a file"],
    ),
    "output_disk_too_small": (  # a 122-trillion-parameter config: no disk holds its checkpoint
        ["model.path={tmp}/huge_model"],
        ["trainer.output_dir=", "GiB free on its disk, but one checkpoint of this run takes about"],
    ),
    "routing_replay_on_a_dense_model": (
        ["actor.moe_routing_replay=true"],
        ["actor.moe_routing_replay=true needs a MoE model", "is dense", "num_local_experts / num_experts"],
    ),
    "routing_replay_with_full_recompute": (
        ["actor.moe_routing_replay=true", "actor.recompute_granularity=full"],
        ["actor.moe_routing_replay=true with actor.recompute_granularity=full", "selective or null"],
    ),
    "routing_replay_with_partial_rollouts": (
        [
            "actor.moe_routing_replay=true",
            "rollout.partial=true",
            "rollout.max_staleness=1",
            "rollout.placement=disaggregated",
            "rollout.num_ranks=1",
            "rollout.balance=partition",
        ],
        ["actor.moe_routing_replay=true with rollout.partial=true", "drop one of them"],
    ),
    "user_pipeline_missing": (
        ["dag.pipeline={tmp}/pipe.py:build"],
        ["dag.pipeline", "pipe.py", "no such file"],
    ),
}


def _rows(n, content="1234", data_source="distflow/copy"):
    return [schema_row(content, content, data_source, "train", i, "copy") for i in range(n)]


def _write(path: Path, rows, schema=None) -> Path:
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    from distflow.models.tiny_tokenizer import train_tiny_tokenizer  # imports transformers (seconds)

    tmp = tmp_path_factory.mktemp("preflight")
    model = tmp / "model"
    train_tiny_tokenizer(300).save_pretrained(model)
    (model / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Qwen2ForCausalLM"],
                "model_type": "qwen2",
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "hidden_size": 64,
                "vocab_size": 300,
            }
        )
    )
    huge = tmp / "huge_model"
    train_tiny_tokenizer(300).save_pretrained(huge)
    huge_config = json.loads((model / "config.json").read_text())
    huge_config.update(num_hidden_layers=2000, num_attention_heads=64, num_key_value_heads=8)
    huge_config.update(hidden_size=65536, intermediate_size=262144)
    (huge / "config.json").write_text(json.dumps(huge_config))
    train = _write(tmp / "train.parquet", _rows(16))
    _write(tmp / "empty.parquet", [], schema=pa.Table.from_pylist(_rows(1)).schema)
    _write(tmp / "nocol.parquet", [{k: v for k, v in r.items() if k != "reward_model"} for r in _rows(2)])
    _write(tmp / "other_source.parquet", _rows(4, data_source="my/source"))
    (tmp / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(5)))
    (tmp / "scorers.py").write_text(
        "def score(solution_str, ground_truth, extra_info=None):\n    return 1.0\n\n"
        "def two_args(answer, truth):\n    return 0.0\n"
    )
    config = tmp / "base.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"path": str(model), "dtype": "float32"},
                "rollout": {"n": 2, "max_new_tokens": 8},
                "data": {
                    "train_files": [str(train)],
                    "val_files": [str(train)],
                    "train_batch_size": 8,
                    "max_prompt_length": 64,
                },
                "reward": {"name": "copy"},
                "dag": {"pipeline": "grpo"},
                "trainer": {"device": "cpu", "total_steps": 2, "output_dir": str(tmp / "out")},
            }
        )
    )
    cases = {
        name: [o.format(tmp=tmp, model=model) for o in overrides] for name, (overrides, _) in CASES.items()
    }
    (tmp / "cases.json").write_text(json.dumps(cases))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, JOB, config, tmp / "cases.json", tmp / "result.json"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp / "result.json").read_text())


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_named_before_the_heavy_start(outcome, case):
    expected = CASES[case][1]
    message = outcome["results"][case]
    if expected is None:
        assert message is None, message
        return
    assert message is not None, f"{case}: the checks passed; expected an error with {expected}"
    for words in expected:
        assert words in message, f"{case}: {words!r} not in {message!r}"
    assert "\n" not in message


def test_accepted_inputs_load_their_prompts(outcome):
    assert outcome["kept"]["good"] == {"train": 16, "val": 16}
    assert outcome["kept"]["jsonl_accepted"]["train"] == 5
    assert outcome["kept"]["single_path_is_a_list"]["train"] == 16


def test_no_megatron_sglang_or_model_code_was_imported(outcome):
    assert outcome["heavy_modules"] == []


def test_config_show_runs_the_preflight(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "distflow.config", "show", f"model.path={tmp_path}/none"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "model.path=" in proc.stderr and "no such directory" in proc.stderr, (
        proc.stderr
    )
    only = subprocess.run(
        [sys.executable, "-m", "distflow.config", "show", "--config-only", f"model.path={tmp_path}/none"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert only.returncode == 0, only.stderr


def test_routing_replay_needs_an_engine_that_returns_routes(tmp_path, monkeypatch):
    """An SGLang without ServerArgs.enable_return_routed_experts is named before anything starts (the
    installed 0.5.23 has it: the check passes on a MoE model)."""
    from distflow import preflight
    from distflow.config import ConfigError, resolve

    (tmp_path / "config.json").write_text(json.dumps({"num_experts": 4, "num_experts_per_tok": 2}))
    cfg = resolve(None, [f"model.path={tmp_path}", "actor.moe_routing_replay=true"])
    preflight.check_routing_replay(cfg)
    monkeypatch.setattr(preflight, "sglang_fields", lambda: frozenset({"model_path", "tp_size"}))
    with pytest.raises(
        ConfigError, match="needs an SGLang that returns the experts it routed .* no such field"
    ):
        preflight.check_routing_replay(cfg)
