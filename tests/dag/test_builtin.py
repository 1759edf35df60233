"""The built-in pipelines (distflow.dag.builtin): each one's exact nodes in order, with their roles, for the
settings that change its graph, and each one's own check of the settings it cannot run."""

import subprocess
import sys
import time

import pytest

from distflow.config import ConfigError, resolve
from distflow.dag.builtin import BUILTIN, CHECKS
from distflow.dag.loading import RUNNABLE, load_pipeline
from distflow.nodes import advantage, dynamic_sampling, reward

REF = ["algorithm.kl_coef=0.01"]  # ref.enable is on by default: a KL term builds the reference
RM = ["reward.model_path=/models/rm"]  # the graph only: no file is read

GRPO = [
    ("generate", "rollout"),
    ("reward", "reward"),
    ("old_logprob", "actor"),
    ("advantage", "all"),
    ("train_actor", "actor"),
    ("sync_weights", "all"),
]
# With one update per step, the update's own forward gives the old log-probs: no old_logprob node.
ONE_UPDATE = [node for node in GRPO if node[0] != "old_logprob"]
GRPO_REF = GRPO[:3] + [("ref_logprob", "ref")] + GRPO[3:]
GRPO_RM = [("generate", "rollout"), ("reward", "reward_model")] + GRPO[2:]
TOKEN_LEVEL_REF = GRPO[:3] + [("ref_logprob", "ref"), ("advantage", "actor")] + GRPO[4:]
PPO = [
    ("generate", "rollout"),
    ("reward", "reward"),
    ("old_logprob", "actor"),
    ("values", "critic"),
    ("advantage", "actor"),
    ("train_critic", "critic"),
    ("train_actor", "actor"),
    ("sync_weights", "all"),
]
PPO_REF = PPO[:3] + [("ref_logprob", "ref")] + PPO[3:]
DAPO = [
    ("generate", "rollout"),
    ("reward", "reward"),
    ("dynamic_sampling", "all"),
    ("old_logprob", "actor"),
    ("advantage", "all"),
    ("train_actor", "actor"),
    ("sync_weights", "all"),
]
DAPO_REF = DAPO[:4] + [("ref_logprob", "ref")] + DAPO[4:]
TWO_MINI = ["actor.mini_batch_size=32"]  # data.train_batch_size=64 by default: two updates per step

CASES = [
    ("grpo", [], ONE_UPDATE),
    ("grpo", ["rollout.max_staleness=1"], ONE_UPDATE),
    ("grpo", ["actor.ppo_epochs=2"], GRPO),
    ("grpo", TWO_MINI, GRPO),
    ("grpo", [*REF, *TWO_MINI], GRPO_REF),
    ("grpo", [*RM, *TWO_MINI], GRPO_RM),
    ("grpo", ["algorithm.adv_estimator=reinforce_pp", *REF], TOKEN_LEVEL_REF),
    ("rloo", ["algorithm.adv_estimator=rloo"], ONE_UPDATE),
    ("rloo", ["algorithm.adv_estimator=rloo", *TWO_MINI], GRPO),
    (
        "rloo",
        ["algorithm.adv_estimator=rloo", *REF, *RM, *TWO_MINI],
        GRPO_RM[:3] + [("ref_logprob", "ref")] + GRPO_RM[3:],
    ),
    (
        "reinforce_pp",
        ["algorithm.adv_estimator=reinforce_pp"],
        GRPO[:3] + [("advantage", "actor")] + GRPO[4:],
    ),
    (
        "reinforce_pp",
        ["algorithm.adv_estimator=reinforce_pp", *REF, "algorithm.kl_in_reward=true"],
        TOKEN_LEVEL_REF,
    ),
    ("reinforce_pp", ["algorithm.adv_estimator=reinforce_pp_baseline", *TWO_MINI], GRPO),
    ("ppo", ["critic.enable=true", "algorithm.adv_estimator=gae"], PPO),
    ("ppo", ["critic.enable=true", "algorithm.adv_estimator=gae", *REF], PPO_REF),
    (
        "ppo",
        ["critic.enable=true", "algorithm.adv_estimator=gae", *RM],
        PPO[:1] + [("reward", "reward_model")] + PPO[2:],
    ),
    ("dapo", ["algorithm.dynamic_sampling=true", *TWO_MINI], DAPO),
    ("dapo", ["algorithm.dynamic_sampling=true", *REF, *TWO_MINI], DAPO_REF),
    ("dapo", ["algorithm.dynamic_sampling=true"], [node for node in DAPO if node[0] != "old_logprob"]),
]


@pytest.mark.parametrize("name, overrides, nodes", CASES, ids=[f"{c[0]} {' '.join(c[1])}" for c in CASES])
def test_each_builtin_lists_its_nodes_in_the_design_order(name, overrides, nodes):
    pipeline = load_pipeline(resolve(None, [f"dag.pipeline={name}", *overrides]))
    assert pipeline.name == name
    assert [(n.id, n.role) for n in pipeline.nodes] == nodes  # as written
    assert [(n.id, n.role) for n in pipeline.validate()] == nodes  # and as run


def test_a_kl_term_without_the_reference_is_refused_by_config_validation():
    with pytest.raises(ConfigError, match=r"algorithm.kl_coef=0.01 needs the reference model"):
        resolve(None, ["algorithm.kl_coef=0.01", "ref.enable=false"])


def test_nodes_are_direct_functions():
    cfg = resolve(None, ["dag.pipeline=dapo"])
    pipeline = BUILTIN["dapo"](cfg)
    assert all(callable(n.fn) for n in pipeline.nodes)
    assert pipeline.node("dynamic_sampling").fn is dynamic_sampling.dynamic_sampling
    assert pipeline.node("advantage").fn is advantage.compute
    assert load_pipeline(resolve(None, RM)).node("reward").fn is reward.model_score


def test_model_rewards_put_the_outcome_advantage_where_they_are():
    p = load_pipeline(resolve(None, RM))
    assert p.node("reward").keep_groups
    assert p.node("advantage").inputs == (
        "rewards",
        "samples",
    )  # a role-"all" node runs where its first input is
    assert load_pipeline(resolve(None, [])).node("advantage").inputs == ("samples", "rewards")


def test_every_builtin_has_a_check_and_is_runnable():
    assert set(CHECKS) == set(BUILTIN)
    assert RUNNABLE == ("smoke", "grpo", "rloo", "ppo", "reinforce_pp", "dapo")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["dag.pipeline=dapo", *RM], r"reward.model_path with dag.pipeline=dapo"),
        (
            ["dag.pipeline=dapo", "algorithm.adv_estimator=reinforce_pp"],
            r"dag.pipeline=dapo runs algorithm.adv_estimator in \['grpo', 'rloo', 'reinforce_pp_baseline'\]",
        ),
        (
            ["dag.pipeline=reinforce_pp"],
            r"dag.pipeline=reinforce_pp runs algorithm.adv_estimator in "
            r"\['reinforce_pp', 'reinforce_pp_baseline'\], got 'grpo'",
        ),
        (
            ["dag.pipeline=grpo", "algorithm.dynamic_sampling=true"],
            r"dynamic_sampling=true needs dag.pipeline=dapo",
        ),
        (
            [
                "dag.pipeline=ppo",
                "critic.enable=true",
                "algorithm.adv_estimator=gae",
                "algorithm.overlong_buffer_len=4",
            ],
            r"overlong_buffer_len=4 \(overlong reward shaping\) needs dag.pipeline=dapo \(got ppo\)",
        ),
    ],
)
def test_a_pipeline_refuses_what_it_cannot_run_before_it_is_built(overrides, message):
    cfg = resolve(None, overrides)
    with pytest.raises(ConfigError, match=message):
        CHECKS[cfg.dag.pipeline](cfg)
    with pytest.raises(ConfigError, match=message):
        load_pipeline(cfg)


def test_dag_show_refuses_a_bad_combination_in_seconds_without_a_process_group():
    """No torchrun, no process group: the CLI answers from the config alone (with torch's import inside)."""
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "distflow.dag", "show", "dag.pipeline=dapo", *RM],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stdout
    assert "reward.model_path with dag.pipeline=dapo" in out.stderr
    assert time.perf_counter() - start < 60


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_routing_replay_moves_the_routes_with_the_samples(name):
    """actor.moe_routing_replay: the samples' routes go to the training layout (every stage); otherwise the
    field does not exist, and a batch holding it would be refused by the data coordinator."""
    settings = {
        "ppo": ["critic.enable=true", "algorithm.adv_estimator=gae"],
        "rloo": ["algorithm.adv_estimator=rloo"],
    }
    overrides = [f"dag.pipeline={name}", *settings.get(name, [])]
    if name == "dapo":
        overrides.append("algorithm.dynamic_sampling=true")
    if name == "reinforce_pp":
        overrides.append("algorithm.adv_estimator=reinforce_pp")
    replayed = load_pipeline(resolve(None, [*overrides, "actor.moe_routing_replay=true"]))
    assert replayed.fields["samples"]["routed_experts"] == "all"
    assert "routed_experts" not in load_pipeline(resolve(None, overrides)).fields["samples"]
