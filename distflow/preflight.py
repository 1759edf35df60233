"""Pre-flight: every check that the config and the files on disk allow, before anything heavy starts.

Called by distflow.train on every rank after config validation and before any process group, Megatron,
SGLang or model import (so a bad input costs seconds, not the minutes of loading a model and starting
engines), and by `python -m distflow.config show`. It sits above distflow.config because its checks need
the layers below the entry point: the pipelines (dag), the scorer registry (rewards), the data schema
(data) and the checkpoint folder rules (checkpointing). Every failure is a ConfigError naming the key or
file and what would be valid. Imports of those layers are inside the functions: `config show` of a bad
key must stay instant.
"""

import difflib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from distflow.checkpointing import CheckpointError, resolve_resume
from distflow.config import ConfigError, DistFlowConfig
from distflow.config.validate import sglang_fields
from distflow.dag.graph import PipelineError
from distflow.dag.loading import RUNNABLE, SMOKE, load_pipeline
from distflow.dag.roles import ranks_of_role
from distflow.data.prompts import DataError, PromptDataset
from distflow.envs import EnvError, load_environment
from distflow.envs.loading import load_tool_parser
from distflow.envs.observations import ObservationEncoder
from distflow.envs.tool_parsers import template_mismatch
from distflow.models.moe import NUM_EXPERTS_KEYS, num_experts
from distflow.plan.model_size import ModelArch
from distflow.rewards.registry import (
    BUILTIN_SCORERS,
    EXPECTED_SIGNATURE,
    ScorerError,
    load_scorer,
    scorer_path,
)

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_ADAM_BYTES_PER_PARAM = 12  # fp32 main weights, first and second moments


@dataclass
class PreflightReport:
    """What the checks found (for `config show` and the start-up log)."""

    prompts: dict = field(default_factory=dict)
    """split -> prompts kept (train, val)."""
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def describe(self) -> str:
        data = ", ".join(f"{n} {split} prompts" for split, n in self.prompts.items()) or "no data (smoke)"
        return "\n".join([f"pre-flight checks passed in {self.seconds:.1f} s: {data}", *self.warnings])


def preflight(cfg: DistFlowConfig, cluster=None) -> PreflightReport:
    """Runs every check; raises ConfigError on the first failure. cluster: the job's ClusterLayout when
    known (distflow.train), so the pipeline's roles are checked against the ranks that host them."""
    start = time.perf_counter()
    report = PreflightReport()
    check_model_paths(cfg)
    check_reward(cfg)
    if cfg.rollout.env is not None:
        check_environment(cfg)
    check_pipeline(cfg, cluster)  # after the instant checks: the built-in pipelines import the nodes (torch)
    if cfg.dag.pipeline != "smoke":  # the smoke run makes its own copy-task data
        report.prompts = check_data(cfg)
    check_resume(cfg)  # last: the checkpointing package imports torch (seconds)
    report.warnings += check_output_dir(cfg)
    report.seconds = time.perf_counter() - start
    return report


def check_pipeline(cfg: DistFlowConfig, cluster=None) -> None:
    """dag.pipeline exists and builds for this config: a built-in pipeline's own check (distflow.dag.builtin,
    run by load_pipeline) and the graph against the job's roles, here before any worker starts; the checks of
    algorithm.* that hold for any pipeline ran in config validation."""
    name = cfg.dag.pipeline
    if name not in RUNNABLE and ":" not in name:
        close = difflib.get_close_matches(name, RUNNABLE, n=1)
        raise ConfigError(
            f"dag.pipeline={name!r} is not a built-in pipeline"
            + (f" (did you mean {close[0]}?)" if close else "")
            + f"; choose one of {list(RUNNABLE)} or a user pipeline 'module:function' / "
            "'path/to/file.py:function'"
        )
    if name == SMOKE:
        return

    pipeline = load_pipeline(
        cfg
    )  # ConfigError for what a built-in DAG cannot run (reward.model_path with dapo, ...)
    if any(node.role == "critic" for node in pipeline.nodes) and not cfg.critic.enable:
        raise ConfigError(
            f"dag.pipeline={name} has critic nodes but there is no critic: set critic.enable=true"
        )
    roles = None
    if cluster is not None:
        roles = [role for role, ranks in ranks_of_role(cluster).items() if ranks]
    try:
        pipeline.validate(roles_with_ranks=roles)
        for node in pipeline.nodes:
            if isinstance(node.fn, str) and not node.fn.startswith("distflow."):
                node.resolve()  # a user node's function must import (the built-in ones import Megatron)
    except PipelineError as err:
        raise ConfigError(f"dag.pipeline={name}: {err}") from None


def check_model_paths(cfg: DistFlowConfig) -> None:
    """model.path (and the tokenizer, critic, reward model and Megatron checkpoints named) exist."""
    _hf_dir("model.path", cfg.model.path)
    if cfg.model.tokenizer_path:
        _existing_dir("model.tokenizer_path", cfg.model.tokenizer_path)
    if cfg.critic.enable and cfg.critic.path:
        _hf_dir("critic.path", cfg.critic.path)
    if cfg.reward.model_path:
        _hf_dir("reward.model_path", cfg.reward.model_path)
    for role in ("actor", "critic", "ref"):
        load = getattr(cfg, role).load
        if load:
            _existing_dir(f"{role}.load", load)
    if cfg.actor.moe_routing_replay:
        check_routing_replay(cfg)


def check_environment(cfg: DistFlowConfig) -> None:
    """rollout.env: the class loads and can serve trajectories; rollout.tool_parser loads and fits the chat
    template, which renders a tool turn (the environment's answers go in as one)."""
    r = cfg.rollout
    try:
        load_environment(r.env)
        parser = load_tool_parser(r.tool_parser)
    except EnvError as err:
        raise ConfigError(str(err)) from None
    for key, clash in (
        ("rollout.partial", r.partial),
        ("actor.moe_routing_replay", cfg.actor.moe_routing_replay),
    ):
        if clash:
            raise ConfigError(
                f"rollout.env={r.env} with {key}=true: multi-turn rollouts do not support it yet"
            )
    tokenizer = _LazyTokenizer(cfg)
    mismatch = template_mismatch(parser, tokenizer.chat_template)
    if mismatch:
        raise ConfigError(
            f"rollout.tool_parser={r.tool_parser} does not fit model.path's tokenizer: {mismatch}"
        )
    try:
        ObservationEncoder(tokenizer)
    except Exception as err:  # the template's own error, whatever jinja raised
        raise ConfigError(
            f"rollout.env={r.env}: model.path's chat template cannot write an environment's answer as a tool "
            f"turn after an assistant turn ({type(err).__name__}: {err})"
        ) from None


def check_routing_replay(cfg: DistFlowConfig) -> None:
    """actor.moe_routing_replay: a MoE model.path, and an SGLang that returns routes (this imports SGLang's
    ServerArgs, a few seconds, only for a run that asks for replay)."""
    config_path = Path(cfg.model.path) / "config.json"
    if not num_experts(json.loads(config_path.read_text())):
        raise ConfigError(
            f"actor.moe_routing_replay=true needs a MoE model, but model.path={cfg.model.path} is dense "
            f"(its config.json names no {' / '.join(NUM_EXPERTS_KEYS)}); set actor.moe_routing_replay=false"
        )
    fields = sglang_fields()
    if fields is not None and "enable_return_routed_experts" not in fields:
        raise ConfigError(
            "actor.moe_routing_replay=true needs an SGLang that returns the experts it routed each token to "
            "(ServerArgs.enable_return_routed_experts, as SGLang 0.5.23 has); the installed one has no such field"
        )


def _hf_dir(key: str, path: str) -> None:
    if not path:
        raise ConfigError(
            f"{key} is not set: give a Hugging Face model directory (config.json, *.safetensors, "
            "tokenizer files)"
        )
    _existing_dir(key, path)
    if not (Path(path) / "config.json").is_file():
        raise ConfigError(f"{key}={path}: no config.json there (expected a Hugging Face model directory)")


def _existing_dir(key: str, path: str) -> None:
    if not Path(path).is_dir():
        raise ConfigError(f"{key}={path}: no such directory")


def check_reward(cfg: DistFlowConfig) -> None:
    """reward.name is a known scorer (or auto) and reward.custom imports and meets the scorer contract."""
    r = cfg.reward
    if r.custom:
        try:
            load_scorer(r.custom)
        except ScorerError as err:
            why = str(err).removeprefix(f"scorer {r.custom!r}: ").removeprefix(f"scorer {r.custom!r} ")
            contract = "" if EXPECTED_SIGNATURE in why else f" (a scorer is {EXPECTED_SIGNATURE})"
            raise ConfigError(f"reward.custom={r.custom!r}: {why}{contract}") from None
        return
    if r.name != "auto" and r.name not in BUILTIN_SCORERS:
        close = difflib.get_close_matches(r.name, list(BUILTIN_SCORERS) + ["auto"], n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(
            f"unknown reward.name {r.name!r}{hint}; choose auto (by data_source) or one of "
            f"{sorted(BUILTIN_SCORERS)}, or set reward.custom='module:function' or "
            "'path/to/file.py:function'"
        )


def check_resume(cfg: DistFlowConfig) -> None:
    """checkpoint.resume names a checkpoint (or auto/never with a usable output folder)."""
    try:
        resolve_resume(cfg.checkpoint.resume, cfg.trainer.output_dir)
    except CheckpointError as err:
        raise ConfigError(str(err)) from None


def check_output_dir(cfg: DistFlowConfig) -> list[str]:
    """trainer.output_dir can be written, and its disk holds at least one checkpoint of the actor (weights
    and Adam state), before anything is written; returns a warning when it cannot hold the
    checkpoint.keep_last + 1 that exist while a new one is saved."""
    out = Path(cfg.trainer.output_dir).absolute()
    if out.exists() and not out.is_dir():
        raise ConfigError(
            f"trainer.output_dir={out} is a file; point it at a folder (it is created if missing)"
        )
    existing = next(p for p in (out, *out.parents) if p.exists())
    read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
    if read_only or not os.access(existing, os.W_OK | os.X_OK):
        why = "on a read-only file system" if read_only else "not writable by this user"
        raise ConfigError(
            f"trainer.output_dir={out}: cannot write there ({existing} is {why}); choose a folder this job "
            "can write to"
        )
    try:
        params = ModelArch.from_json(cfg.model.path).total_params
    except Exception:  # noqa: BLE001 - an architecture the planner does not count: no size to check against
        return []
    one = params * (_DTYPE_BYTES.get(cfg.model.dtype, 4) + _ADAM_BYTES_PER_PARAM)
    free = shutil.disk_usage(existing).free
    if one > free:
        raise ConfigError(
            f"trainer.output_dir={out}: {free / 2**30:.2f} GiB free on its disk, but one checkpoint of this "
            f"run takes about {one / 2**30:.2f} GiB ({params / 1e9:.2f} B parameters: weights and Adam "
            "state); free space or point trainer.output_dir at a larger disk"
        )
    copies = cfg.checkpoint.keep_last + 1
    if one * copies > free:
        return [
            f"warning: trainer.output_dir={out}: {free / 2**30:.2f} GiB free, {copies} checkpoints of about "
            f"{one / 2**30:.2f} GiB each exist while one is saved (checkpoint.keep_last={cfg.checkpoint.keep_last}): "
            "a save may run out of space"
        ]
    return []


def check_data(cfg: DistFlowConfig) -> dict:
    """Loads the train (and val) split as the trainer will, with the tokenizer: the files exist and follow
    the schema, at least one prompt fits data.max_prompt_length, and reward.name=auto has a scorer for every
    data_source. Returns {split: prompts kept}."""
    d = cfg.data
    if not d.train_files:
        raise ConfigError(
            f"data.train_files is empty: dag.pipeline={cfg.dag.pipeline} trains on prompts; give "
            "parquet/jsonl files in the common RL schema (tools/prepare_data.py writes some)"
        )
    for split in ("train", "val"):  # before the tokenizer loads: a wrong path is answered at once
        for i, path in enumerate(getattr(d, f"{split}_files")):
            if not Path(path).is_file():
                raise ConfigError(
                    f"data.{split}_files[{i}]={path}: no such file"
                    + (" (it is a folder: list its files)" if Path(path).is_dir() else "")
                )
    tokenizer = _LazyTokenizer(cfg)  # loaded at the first prompt to tokenize: an empty or bad file is faster
    kept = {}
    for split in ("train", "val"):
        if split == "val" and not d.val_files:
            continue
        try:
            dataset = PromptDataset.from_config(d, tokenizer, split)
        except DataError as err:
            raise ConfigError(f"data.{split}_files: {err}") from None
        if split == "val" or not cfg.reward.model_path:  # a reward model scores any training sample
            _check_data_sources(cfg, split, dataset)
        kept[split] = len(dataset)
    return kept


class _LazyTokenizer:
    """The run's tokenizer, loaded on first use: importing transformers (and torch under it) takes seconds
    to tens of seconds on a busy machine, and a missing, empty or malformed data file needs no tokenizer."""

    def __init__(self, cfg: DistFlowConfig):
        self._cfg, self._tokenizer = cfg, None

    def _load(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer  # noqa: PLC0415 - the tokenizer only; no model code is imported

            m = self._cfg.model
            path, key = (
                (m.tokenizer_path, "model.tokenizer_path") if m.tokenizer_path else (m.path, "model.path")
            )
            try:
                self._tokenizer = AutoTokenizer.from_pretrained(path)
            except (OSError, ValueError) as err:
                raise ConfigError(f"{key}={path}: cannot load a tokenizer there: {err}") from None
        return self._tokenizer

    def __getattr__(self, name):
        return getattr(self._load(), name)

    def __call__(self, *args, **kwargs):
        return self._load()(*args, **kwargs)


def _check_data_sources(cfg: DistFlowConfig, split: str, dataset) -> None:
    for source in sorted({p.data_source for p in dataset}):
        try:
            scorer_path(cfg.reward.name, cfg.reward.custom, source)
        except ScorerError as err:
            raise ConfigError(f"data.{split}_files: {err}") from None
