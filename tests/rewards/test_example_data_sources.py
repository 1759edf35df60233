"""Every example scores its own default data: for each examples/*.sh (reward.name, and the data_source its
TRAIN_FILES / VAL_FILES comment names) and each examples/configs/*.yaml (reward.name, and the data_source of
the tools/prepare_data.py mode its header comment runs), the reward configuration has a scorer for that
data_source, and that scorer rewards an answer in the format the data's prompts ask for."""

import re
from pathlib import Path

import pytest
import yaml

from distflow.data import preparation
from distflow.rewards.registry import BUILTIN_SCORERS, load_scorer, scorer_path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# tools/prepare_data.py mode -> the data_source it writes (its default)
PREPARED_SOURCES = {
    "gsm8k": preparation.GSM8K_SOURCE,
    "gsm_symbolic": preparation.GSM8K_SOURCE,
    "math": preparation.MATH_SOURCE,
    "copy": preparation.COPY_SOURCE,
    "lookup": preparation.LOOKUP_SOURCE,
}
# data_source -> a correct answer in its prompts' format and the ground truth (DAPO's prompts ask for "Answer:")
FORMATTED_ANSWERS = {
    preparation.GSM8K_SOURCE: ("3 + 4 = 7\n#### 7", "7"),
    preparation.MATH_SOURCE: ("so \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    preparation.COPY_SOURCE: ("1234", "1234"),
    preparation.LOOKUP_SOURCE: ("064", "064"),  # the final turn: the looked-up value
    "math_dapo": ("The sum is 34.\nAnswer: 34", "34"),
}


def script_settings(path: Path) -> tuple[str, dict[str, str]]:
    """(reward.name, {"TRAIN_FILES" | "VAL_FILES": data_source}) read from a launch script."""
    text = path.read_text()
    names = re.findall(r"^\s*reward\.name=(\S+)", text, re.MULTILINE)
    assert len(names) == 1, f"{path.name}: expected one reward.name=... line, found {names}"
    sources = dict(re.findall(r"^(TRAIN_FILES|VAL_FILES)=.*#\s*data_source (\S+)", text, re.MULTILINE))
    assert set(sources) == {"TRAIN_FILES", "VAL_FILES"}, (
        f"{path.name}: TRAIN_FILES and VAL_FILES each need a '# data_source <name>' comment (found {sources})"
    )
    return names[0], sources


def config_settings(path: Path) -> tuple[str, dict[str, str]]:
    """(reward.name, {"train": data_source, "val": data_source}) of a YAML example config."""
    text = path.read_text()
    config = yaml.safe_load(text)
    modes = set(re.findall(r"tools/prepare_data\.py (\w+)", text))
    assert len(modes) == 1, f"{path.name}: expected one prepare_data.py command in its header, found {modes}"
    source = PREPARED_SOURCES[modes.pop()]
    return config.get("reward", {}).get("name", "gsm8k"), {"train": source, "val": source}


SCRIPTS = sorted(EXAMPLES.glob("*.sh"))
CONFIGS = [
    p for p in sorted((EXAMPLES / "configs").glob("*.yaml")) if "data" in yaml.safe_load(p.read_text())
]


def check_scored(where: str, name: str, sources: dict[str, str]) -> None:
    for files, source in sources.items():
        path = scorer_path(name, None, source)  # raises ScorerError: no scorer for this data_source
        response, truth = FORMATTED_ANSWERS[source]
        assert load_scorer(path)(response, truth, None, data_source=source, ended_with_eos=True) == 1.0, (
            f"{where}: {files} (data_source {source}) is scored by {path}, which does not reward an answer in "
            f"the format its prompts ask for: {response!r}"
        )


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_script_scores_its_default_data(script):
    name, sources = script_settings(script)
    check_scored(script.name, name, sources)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_every_config_scores_its_prepared_data(config):
    name, sources = config_settings(config)
    assert name == "auto" or name in BUILTIN_SCORERS, f"{config.name}: reward.name={name!r}"
    check_scored(config.name, name, sources)


def test_the_dapo_scripts_are_covered():
    dapo = [s.name for s in SCRIPTS if script_settings(s)[1]["TRAIN_FILES"] == "math_dapo"]
    assert sorted(dapo) == [
        "dapo_qwen2.5_32b_4nodes.sh",
        "grpo_qwen3_235b_a22b_16nodes.sh",
        "grpo_qwen3_30b_a3b_2nodes.sh",
    ]
