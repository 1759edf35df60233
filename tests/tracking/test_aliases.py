"""The verl alias table: one verl name per DistFlow name, no clash with a DistFlow name, all documented."""

from pathlib import Path

from distflow.tracking.aliases import TIMING_ALIASES, VERL_ALIASES, alias, rename

GLOSSARY = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()


def test_aliases_are_one_to_one_and_documented():
    assert len(set(VERL_ALIASES.values())) == len(VERL_ALIASES)
    assert not set(VERL_ALIASES.values()) & set(VERL_ALIASES)  # renaming twice changes nothing
    for verl_name in VERL_ALIASES.values():
        assert f"`{verl_name.rsplit('/', 1)[0]}/" in GLOSSARY or f"`{verl_name}`" in GLOSSARY, verl_name
    for node, verl_node in TIMING_ALIASES.items():
        assert verl_node in GLOSSARY, verl_node


def test_rename():
    assert alias("timing_s/my_node", "verl") == "timing_s/my_node"  # a user node keeps its id
    assert alias("reward/mean", "distflow") == "reward/mean"
    assert rename({"reward/min": 0.0, "sync/seconds": 1.0}, "verl") == {
        "critic/score/min": 0.0,
        "sync/seconds": 1.0,
    }
