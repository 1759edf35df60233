"""DAG definition and validation: execution order, and errors that name the node."""

import subprocess
import sys

import pytest

from distflow.config import resolve
from distflow.dag import Pipeline, PipelineError
from distflow.dag.builtin import BUILTIN
from distflow.dag.roles import ranks_of_role
from distflow.layout import ClusterLayout


def noop(ctx, inputs):
    return {}


def test_order_follows_data_not_declaration():
    p = (
        Pipeline("t")
        .add("train", "actor", noop, ["adv"], ["m"])
        .add("adv", "all", noop, ["prompts"], ["adv"])
    )
    assert [n.id for n in p.validate()] == ["adv", "train"]


@pytest.mark.parametrize(
    "build, message",
    [
        (
            lambda p: p.add("a", "all", noop, ["y"], ["x"]).add("b", "all", noop, ["x"], ["y"]),
            r"cycle: a -> b -> a",
        ),
        (
            lambda p: p.add("a", "all", noop, ["ghost"], ["x"]),
            r"node 'a': input 'ghost' is produced by no node",
        ),
        (
            lambda p: p.add("a", "all", noop, [], ["x"]).add("a", "all", noop, [], ["y"]),
            r"two nodes are named 'a'",
        ),
        (
            lambda p: p.add("a", "all", noop, [], ["x"]).add("b", "all", noop, [], ["x"]),
            r"node 'b': output 'x' is already produced by a",
        ),
        (lambda p: p.add("a", "trainer", noop, [], ["x"]), r"node 'a': role 'trainer' is not one of"),
    ],
)
def test_validation_errors_name_the_node(build, message):
    with pytest.raises(PipelineError, match=message):
        build(Pipeline("t")).validate()


def test_role_without_ranks_is_rejected():
    p = Pipeline("t").add("values", "critic", noop, ["prompts"], ["v"])
    with pytest.raises(PipelineError, match=r"node 'values' runs on role 'critic', which has no ranks"):
        p.validate(roles_with_ranks=["actor", "rollout"])


def test_unresolvable_function_names_node():
    p = Pipeline("t").add("a", "all", "distflow.no_such_module:fn", [], ["x"])
    with pytest.raises(
        PipelineError, match=r"node 'a': cannot load its function 'distflow.no_such_module:fn'"
    ):
        p.node("a").resolve()


@pytest.mark.parametrize(
    "name, overrides, nodes",
    [
        ("grpo", [], ["generate", "reward", "advantage", "train_actor", "sync_weights"]),
        (
            "grpo",
            ["algorithm.kl_coef=0.01", "actor.ppo_epochs=2"],
            ["generate", "reward", "old_logprob", "ref_logprob", "advantage", "train_actor", "sync_weights"],
        ),
        (
            "ppo",
            ["critic.enable=true", "algorithm.adv_estimator=gae"],
            [
                "generate",
                "reward",
                "old_logprob",
                "values",
                "advantage",
                "train_critic",
                "train_actor",
                "sync_weights",
            ],
        ),
        (
            "dapo",
            ["algorithm.dynamic_sampling=true", "actor.ppo_epochs=2"],
            [
                "generate",
                "reward",
                "dynamic_sampling",
                "old_logprob",
                "advantage",
                "train_actor",
                "sync_weights",
            ],
        ),
    ],
)
def test_builtin_pipelines_validate_against_their_roles(name, overrides, nodes):
    cfg = resolve(None, [f"dag.pipeline={name}", *overrides])
    cluster = ClusterLayout.from_config(cfg, 4, None)
    roles = [r for r, ranks in ranks_of_role(cluster).items() if ranks]
    assert [n.id for n in BUILTIN[name](cfg).validate(roles)] == nodes


def test_ppo_without_critic_ranks_fails_validation():
    cfg = resolve(None, ["dag.pipeline=ppo"])  # critic.enable stays false
    cluster = ClusterLayout.from_config(cfg, 2, None)
    roles = [r for r, ranks in ranks_of_role(cluster).items() if ranks]
    with pytest.raises(PipelineError, match=r"node 'values' runs on role 'critic'"):
        BUILTIN["ppo"](cfg).validate(roles)


def test_show_prints_roles_and_layouts():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "distflow.dag",
            "show",
            "actor.tp=2",
            "--world-size",
            "4",
            "rollout.engine_tp=2",
            "actor.ppo_epochs=2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "old_logprob       role=actor    ranks=0-3      layout: tp=2 pp=1 dp=2" in out.stdout
    assert "2 engine(s) x engine TP 2" in out.stdout
