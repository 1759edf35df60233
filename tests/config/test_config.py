"""Config loading: YAML + overrides, typed fields, errors that name the key and the closest valid one."""

import dataclasses
import subprocess
import sys

import pytest

from distflow.config import ConfigError, DistFlowConfig, load_config, resolve
from distflow.config.schema import DistFlowConfig as Schema


def write(tmp_path, text):
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def test_yaml_and_overrides_reach_typed_fields(tmp_path):
    path = write(tmp_path, "actor:\n  tp: 2\n  optim:\n    lr: 1.0e-5\nrollout:\n  n: 4\n")
    cfg = resolve(path, ["actor.pp=2", "rollout.temperature=0.7", "data.train_files=[a.parquet,b.parquet]"])
    assert (cfg.actor.tp, cfg.actor.pp, cfg.actor.optim.lr) == (2, 2, 1e-5)
    assert cfg.rollout.n == 4 and cfg.rollout.temperature == 0.7
    assert cfg.data.train_files == ["a.parquet", "b.parquet"]
    assert cfg.critic.mini_batch_size == 0  # untouched sections keep their defaults
    assert cfg.critic.tp is None and cfg.parallel_sizes("critic")["tp"] == 2  # unset: the actor's


def test_exponent_without_dot_is_a_float():
    assert resolve(None, ["actor.optim.lr=1e-6"]).actor.optim.lr == 1e-6


def test_int_is_accepted_for_float_field():
    cfg = resolve(None, ["rollout.temperature=1"])
    assert cfg.rollout.temperature == 1.0 and isinstance(cfg.rollout.temperature, float)


def test_typo_names_the_closest_key():
    with pytest.raises(ConfigError, match=r"'actor\.tpp'.*did you mean actor\.tp\?"):
        load_config(None, ["actor.tpp=2"])


def test_unknown_section_names_the_closest_section(tmp_path):
    with pytest.raises(ConfigError, match=r"'rollot'.*did you mean rollout\?"):
        load_config(write(tmp_path, "rollot:\n  n: 4\n"))


@pytest.mark.parametrize(
    "override, message",
    [
        ("actor.tp=two", r"actor\.tp must be int, got 'two'"),
        ("actor.tp=true", r"actor\.tp must be int, got True"),
        ("rollout.placement=colo", r"rollout\.placement='colo' is not one of .*did you mean 'colocated'"),
        ("data.train_files={a: 1}", r"data\.train_files must be a list"),
        ("rollout.stop_token_ids=[1,x]", r"rollout\.stop_token_ids\[1\] must be int"),
        ("actor=3", r"actor must be a mapping"),
    ],
)
def test_wrong_type_names_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["actor.sequence_parallel=true"], r"actor\.sequence_parallel=true needs actor\.tp > 1"),
        (["rollout.placement=disaggregated"], r"needs rollout\.num_ranks >= 1"),
        (["rollout.num_ranks=2"], r"only applies to placement=disaggregated"),
        (["algorithm.adv_estimator=gae"], r"set critic\.enable=true"),
        (["tracking.backends=[console,mlflow]"], r"tracking\.backends\[1\]='mlflow'"),
        (["actor.tp=0"], r"actor\.tp=0 must be >= 1"),
        (["sync.bucket_mb=0.0001"], r"sync\.bucket_mb=0\.0001 must be at least 1 KiB"),
        (["reward.env_reward_coef=0.5"], r"reward\.env_reward_coef=0\.5 needs rollout\.env"),
        (["rollout.max_turns=2"], r"rollout\.max_turns=2 needs rollout\.env"),
        (["rollout.max_turns=0", "rollout.env=lookup"], r"rollout\.max_turns=0 must be >= 1"),
    ],
)
def test_cross_field_checks(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve(None, overrides)


def test_megatron_passthrough_is_checked_against_transformer_config():
    cfg = resolve(None, ["actor.megatron.attention_softmax_in_fp32=true"])
    assert cfg.actor.megatron == {"attention_softmax_in_fp32": True}
    with pytest.raises(
        ConfigError, match=r"actor\.megatron\.num_layerz.*did you mean actor\.megatron\.num_layers"
    ):
        resolve(None, ["actor.megatron.num_layerz=2"])
    with pytest.raises(ConfigError, match=r"set by DistFlow from actor\.tp"):
        resolve(None, ["actor.megatron.tensor_model_parallel_size=2"])


def test_sglang_passthrough_is_checked_against_server_args():
    cfg = resolve(None, ["rollout.sglang.chunked_prefill_size=512"])
    assert cfg.rollout.sglang == {"chunked_prefill_size": 512}
    with pytest.raises(ConfigError, match=r"rollout\.sglang\.chunked_prefil_size.*did you mean"):
        resolve(None, ["rollout.sglang.chunked_prefil_size=512"])
    with pytest.raises(ConfigError, match=r"set by DistFlow from rollout\.engine_tp"):
        resolve(None, ["rollout.sglang.tp_size=2"])
    with pytest.raises(ConfigError, match=r"set by DistFlow from rollout\.engine_nnodes"):
        resolve(None, ["rollout.sglang.node_rank=1"])
    with pytest.raises(ConfigError, match=r"engine_nnodes=3 must be >= 1 and divide rollout.engine_tp=4"):
        resolve(None, ["rollout.engine_tp=4", "rollout.engine_nnodes=3"])


def test_every_field_is_documented():
    def walk(cls, prefix=""):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{prefix}{f.name} has no documentation"
            if dataclasses.is_dataclass(f.type) or (
                isinstance(f.type, type) and dataclasses.is_dataclass(f.type)
            ):
                walk(f.type, f"{prefix}{f.name}.")

    walk(Schema)


def test_bad_override_syntax_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="must look like section.key=value"):
        load_config(None, ["actor.tp"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "actor: [tp: 2\n"))


def test_show_cli_prints_resolved_config_and_rejects_typos(tmp_path):
    path = write(tmp_path, "actor:\n  tp: 2\n")
    out = subprocess.run(
        [sys.executable, "-m", "distflow.config", "show", "--config-only", str(path), "rollout.n=3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "tp: 2" in out.stdout and "n: 3" in out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "distflow.config", "show", "actor.tpp=2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "did you mean actor.tp?" in bad.stderr


def test_shipped_example_configs_resolve():
    from pathlib import Path

    configs = sorted((Path(__file__).resolve().parents[2] / "examples" / "configs").glob("*.yaml"))
    assert configs, "examples/configs/ has no YAML files"
    for path in configs:
        assert isinstance(resolve(path), DistFlowConfig)
