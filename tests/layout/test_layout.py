"""Parallel layouts and placement: validation with numbers in the errors, and rank <-> coordinate maps."""

import itertools

import pytest

from distflow.config import ConfigError, resolve
from distflow.layout import ClusterLayout, LayoutError, ParallelLayout, Placement
from distflow.layout.model_shape import ModelShape

DENSE = ModelShape(num_layers=4, num_heads=8, num_kv_heads=2, hidden_size=64, vocab_size=512)
MOE = ModelShape(num_layers=4, num_heads=8, num_kv_heads=4, hidden_size=64, vocab_size=512, num_experts=6)


def test_dp_is_derived_from_world_size():
    layout = ParallelLayout.for_world(16, tp=2, pp=2)
    assert (layout.tp, layout.pp, layout.dp, layout.etp) == (2, 2, 4, 2)
    assert layout.world_size == 16


@pytest.mark.parametrize(
    "world, kwargs, message",
    [
        (6, dict(tp=4), r"world size 6 is not divisible by tp\*pp\*cp = 4\*1\*1 = 4"),
        (8, dict(tp=1, ep=3), r"not divisible by etp\*ep = 1\*3 = 3"),
        (4, dict(vpp=2), r"vpp=2 needs pipeline parallelism"),
        (4, dict(tp=0), r"actor\.tp=0 must be >= 1"),
    ],
)
def test_world_size_errors_name_the_numbers(world, kwargs, message):
    with pytest.raises(LayoutError, match=message):
        ParallelLayout.for_world(world, **kwargs)


@pytest.mark.parametrize(
    "shape, kwargs, message",
    [
        (DENSE, dict(tp=16), r"tp=16 does not divide the model's 8 attention heads"),
        (DENSE, dict(tp=4), r"tp=4 does not divide the model's 2 KV heads"),
        (DENSE, dict(pp=8), r"4 layers cannot be split evenly over pp\*vpp = 8\*1 = 8"),
        (DENSE, dict(pp=2, vpp=4), r"pp\*vpp = 2\*4 = 8"),
        (DENSE, dict(ep=2), r"ep=2 but the model is dense"),
        (MOE, dict(ep=4), r"ep=4 does not divide the model's 6 experts"),
    ],
)
def test_model_errors_name_the_numbers(shape, kwargs, message):
    layout = ParallelLayout.for_world(16, **kwargs)
    with pytest.raises(LayoutError, match=message):
        layout.validate_for_model(shape)


def test_coords_and_rank_are_inverse_and_megatron_ordered():
    layout = ParallelLayout.for_world(24, tp=2, pp=3, cp=2)
    seen = set()
    for rank in range(24):
        c = layout.coords(rank)
        assert layout.rank(c.tp, c.cp, c.dp, c.pp) == rank
        seen.add((c.tp, c.cp, c.dp, c.pp))
    assert len(seen) == 24
    # Megatron's default order: tp fastest, pp slowest.
    assert layout.tp_group(0) == [0, 1] and layout.pp_group(0) == [0, 8, 16]


def test_groups_partition_the_world():
    for tp, pp in itertools.product((1, 2, 4), (1, 2)):
        layout = ParallelLayout.for_world(8, tp=tp, pp=pp)
        for group_of in (layout.tp_group, layout.pp_group, layout.dp_group):
            groups = {tuple(group_of(r)) for r in range(8)}
            assert sorted(r for g in groups for r in g) == list(range(8))


def test_colocated_and_disaggregated_placement():
    colo = Placement.create("colocated", 8, engine_tp=2)
    assert colo.num_engines == 4 and colo.engine_ranks(1) == (2, 3)
    assert colo.owns_engine(2) and not colo.owns_engine(3)
    dis = Placement.create("disaggregated", 8, engine_tp=2, num_rollout_ranks=4)
    assert dis.train_ranks == (0, 1, 2, 3) and dis.rollout_ranks == (4, 5, 6, 7)
    assert dis.engine_of(1) is None and dis.engine_of(7) == 1


def test_multi_node_engines_start_one_sglang_process_per_node():
    # 32 ranks, 8 per node; engines of TP 16 over 2 nodes: ranks 0 and 8 start engine 0's two halves.
    p = Placement.create("colocated", 32, engine_tp=16, engine_nnodes=2)
    assert p.num_engines == 2 and p.engine_ranks(1) == tuple(range(16, 32))
    assert [r for r in range(32) if p.engine_node_rank(r) is not None] == [0, 8, 16, 24]
    assert [p.engine_node_rank(r) for r in (0, 8, 16, 24)] == [0, 1, 0, 1]
    assert p.owns_engine(0) and not p.owns_engine(8) and p.engine_node_rank(9) is None
    single = Placement.create("disaggregated", 4, engine_tp=2, num_rollout_ranks=2)
    assert [single.engine_node_rank(r) for r in range(4)] == [None, None, 0, None]


@pytest.mark.parametrize(
    "args, message",
    [
        (("colocated", 6, 4, 0), r"engine_tp=4 does not divide the 6 rollout ranks"),
        (("disaggregated", 4, 1, 4), r"num_ranks=4 must leave training ranks"),
        (("colocated", 8, 4, 0, 3), r"engine_nnodes=3 must divide rollout.engine_tp=4"),
    ],
)
def test_placement_errors(args, message):
    with pytest.raises(LayoutError, match=message):
        Placement.create(*args)


def test_engine_tp_against_heads():
    with pytest.raises(LayoutError, match=r"engine_tp=16 does not divide the model's 8 attention heads"):
        Placement.create("colocated", 16, engine_tp=16).validate_for_model(DENSE)
    Placement.create("colocated", 8, engine_tp=8).validate_for_model(DENSE)  # KV heads replicated: fine


def test_cluster_layout_from_config():
    cfg = resolve(
        None,
        [
            "actor.tp=2",
            "ref.tp=2",
            "rollout.placement=disaggregated",
            "rollout.num_ranks=2",
            "rollout.engine_tp=2",
            "algorithm.kl_coef=0.1",
        ],
    )
    cluster = ClusterLayout.from_config(cfg, 6, DENSE)
    assert cluster.actor.dp == 2 and cluster.ref == cluster.actor and cluster.critic is None
    assert cluster.placement.rollout_ranks == (4, 5)
    assert "engine 0: ranks [4, 5]" in cluster.describe()


def test_cluster_layout_rejects_before_any_process_group():
    cfg = resolve(None, ["actor.tp=2"])
    with pytest.raises(LayoutError, match=r"world size 3 is not divisible by tp\*pp\*cp = 2\*1\*1 = 2"):
        ClusterLayout.from_config(cfg, 3, DENSE)


def test_reference_and_critic_must_share_the_actor_layout():
    cfg = resolve(None, ["actor.tp=2", "ref.tp=1", "algorithm.kl_coef=0.1"])
    with pytest.raises(
        LayoutError, match=r"ref\.tp=1 \(actor\.tp=2\).*set its parallel sizes to the actor's"
    ):
        ClusterLayout.from_config(cfg, 4, DENSE)
    cfg = resolve(None, ["actor.pp=2", "critic.enable=true", "critic.pp=1"])
    with pytest.raises(LayoutError, match=r"critic\.pp=1 \(actor\.pp=2\)"):
        ClusterLayout.from_config(cfg, 4, DENSE)


def test_reference_and_critic_layouts_default_to_the_actor_layout():
    cfg = resolve(
        None,
        [
            "actor.tp=2",
            "actor.pp=2",
            "actor.vpp=2",
            "algorithm.kl_coef=0.1",
            "critic.enable=true",
            "critic.tp=2",
        ],
    )  # an explicit equal size is fine too
    cluster = ClusterLayout.from_config(cfg, 8, DENSE)
    assert (
        cluster.ref == cluster.actor == cluster.critic
        and cluster.actor.describe() == "tp=2 pp=2 dp=2 cp=1 vpp=2"
    )
    cfg = resolve(
        None, ["actor.tp=2", "actor.ep=2", "actor.etp=1", "algorithm.kl_coef=0.1", "critic.enable=true"]
    )
    cluster = ClusterLayout.from_config(cfg, 4, MOE)
    assert cluster.ref == cluster.critic == cluster.actor and (cluster.ref.ep, cluster.ref.etp) == (2, 1)


def test_sequence_parallel_of_a_role_reads_its_tp_or_the_actors():
    assert resolve(None, ["actor.tp=2", "ref.sequence_parallel=true"]).parallel_sizes("ref")["tp"] == 2
    with pytest.raises(ConfigError, match=r"ref\.sequence_parallel=true needs ref\.tp > 1 \(got tp=1\)"):
        resolve(None, ["actor.tp=2", "ref.tp=1", "ref.sequence_parallel=true"])
    with pytest.raises(ConfigError, match=r"critic\.pp=0 must be >= 1"):
        resolve(None, ["critic.pp=0"])
