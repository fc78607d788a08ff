"""Pipeline planning, without TensorFlow: partitions, schedules, layouts and their errors."""

from __future__ import annotations

import doctest
import importlib
import itertools

import pytest

from tfdist.errors import StrategyConfigError
from tfdist.pipeline import partition, schedule
from tfdist.pipeline.layout import PipelineLayout, check_processes

pytestmark = pytest.mark.unit

NAMES = ["d0", "d1", "d2", "d3", "d4"]


@pytest.mark.parametrize("name", ["tfdist.pipeline", "tfdist.pipeline.partition",
                                  "tfdist.pipeline.schedule", "tfdist.pipeline.layout",
                                  "tfdist.parallel.mesh"])
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_split_points_give_bounds():
    assert partition.bounds_from_split_points(NAMES, ["d2"], stages=2) == (0, 2, 5)
    assert partition.bounds_from_split_points(NAMES, ["d1", "d4"], stages=3) == (0, 1, 4, 5)


@pytest.mark.parametrize("points, stages, message", [
    (["nope"], 2,
     "Split point 'nope' is not a layer of the model. Received: split_points=['nope']"),
    (["d3", "d1"], 3, "Split points must be distinct and in the model's layer order."),
    (["d1", "d1"], 3, "Split points must be distinct"),
    (["d0"], 2, "Split point 'd0' is the first layer: stage 0 would be empty."),
    (["d1"], 3, "3 stages need 2 split point(s). Received: split_points=['d1']"),
])
def test_bad_split_points_are_named(points, stages, message):
    with pytest.raises(StrategyConfigError, match="Fix: ") as info:
        partition.bounds_from_split_points(NAMES, points, stages=stages)
    assert message in str(info.value)


def test_more_stages_than_layers_is_an_error():
    with pytest.raises(StrategyConfigError) as info:
        partition.check_stages(6, num_layers=5)
    assert "The model has 5 layer(s), fewer than the 6 stages asked for." in str(info.value)
    assert "Fix: use stages=5 or fewer" in str(info.value)
    with pytest.raises(StrategyConfigError, match="stages must be a positive int"):
        partition.check_stages(0)


def test_batch_not_divisible_by_micro_batches():
    with pytest.raises(StrategyConfigError) as info:
        partition.check_micro_batches(4, batch=10)
    assert "A batch of 10 rows cannot be cut into 4 equal micro-batches." in str(info.value)
    assert "Fix: use a batch of 8" in str(info.value)


def _brute_force(costs, stages):
    n = len(costs)
    best = None
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = (0, *cuts, n)
        worst = max(partition.stage_costs(costs, bounds))
        if best is None or worst < best:
            best = worst
    return best


@pytest.mark.parametrize("costs, stages", [
    ([1, 1, 1, 1], 2), ([5, 1, 1, 1, 1, 1], 2), ([3, 1, 4, 1, 5, 9, 2, 6], 3),
    ([1, 2, 3, 4, 5, 6, 7], 4), ([7], 1), ([2, 2, 2], 3),
])
def test_balanced_bounds_are_optimal(costs, stages):
    bounds = partition.balanced_bounds(costs, stages)
    assert len(bounds) == stages + 1 and bounds[0] == 0 and bounds[-1] == len(costs)
    assert all(a < b for a, b in itertools.pairwise(bounds))
    assert max(partition.stage_costs(costs, bounds)) == _brute_force(costs, stages)


# Synthetic graphs: (node inputs, node outputs, model inputs, model outputs); tensor ids.
CHAIN = ([(0,), (1,), (2,), (3,)], [(1,), (2,), (3,), (4,)], [0], [4])
# x -> n0 -> n1 -> n2 = add(n0, n1) -> n3 = add(n2, x): a skip over n1, one from the input.
RESIDUAL = ([(0,), (1,), (1, 2), (3, 0)], [(1,), (2,), (3,), (4,)], [0], [4])
# Two inputs (x: 0, mask: 1, integer); every block reads the mask; two outputs, the first made
# early: n0(x) -> n1(n0, mask) -> n2(n1, mask) -> n3(n2); outputs n0's and n3's.
TWO_INPUTS = ([(0,), (2, 1), (3, 1), (4,)], [(2,), (3,), (4,), (5,)], [0, 1], [2, 5])
# A node with two outputs (tensors 2 and 3) read by different later nodes.
TWO_OUTPUTS = ([(0,), (1,), (2,), (3, 4)], [(1,), (2, 3), (4,), (5,)], [0], [5])


@pytest.mark.parametrize("graph, bounds, expected", [
    (CHAIN, (0, 2, 4), ((2,),)),
    (CHAIN, (0, 1, 2, 3, 4), ((1,), (2,), (3,))),
    (RESIDUAL, (0, 1, 4), ((0, 1),)),
    (RESIDUAL, (0, 2, 4), ((0, 1, 2),)),
    (RESIDUAL, (0, 1, 2, 4), ((0, 1), (0, 1, 2))),
    (RESIDUAL, (0, 3, 4), ((0, 3),)),
    (TWO_INPUTS, (0, 1, 4), ((1, 2),)),
    (TWO_INPUTS, (0, 2, 3, 4), ((1, 2, 3), (2, 4))),
    (TWO_OUTPUTS, (0, 2, 4), ((2, 3),)),
    (TWO_OUTPUTS, (0, 3, 4), ((3, 4),)),
])
def test_the_tensors_alive_across_each_cut(graph, bounds, expected):
    assert partition.crossing(*graph, bounds) == expected


def test_cut_bytes_and_balancing_prefer_the_lighter_cut():
    # The cut after n0 carries x and n0 (8 bytes), after n1 three tensors, after n2 two.
    carried = partition.cut_bytes(*RESIDUAL, tensor_bytes=[4, 4, 4, 4, 4])
    assert carried == [0, 8, 12, 8]
    assert partition.balanced_bounds([1, 1, 1, 1], 2, carried) == (0, 2, 4)
    # Cuts after n0, n1 or n2 all balance [1, 0, 0, 1]; the first and last carry 8 bytes.
    assert partition.balanced_bounds([1, 0, 0, 1], 2, carried) == (0, 1, 4)
    assert partition.balanced_bounds([1, 0, 0, 1], 2, [0, 9, 9, 1]) == (0, 3, 4)


def test_batch_norm_is_refused_with_micro_batches():
    partition.check_layer_classes(["Dense", "BatchNormalization"], ["d", "bn"], 1)
    with pytest.raises(StrategyConfigError) as info:
        partition.check_layer_classes(["Dense", "BatchNormalization"], ["d", "bn"], 4)
    assert "Layer 'bn' is a BatchNormalization: with micro_batches=4" in str(info.value)
    assert "per micro-batch" in str(info.value)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages, micro_batches", [(1, 1), (2, 1), (2, 4), (3, 4), (4, 8), (3, 2)])
def test_schedules_are_complete_and_deadlock_free(name, stages, micro_batches):
    plans = [schedule.get_schedule(name, stages, micro_batches, k) for k in range(stages)]
    for ops in plans:
        assert sorted(ops) == sorted((op, m) for op in "FB" for m in range(micro_batches))
        for m in range(micro_batches):
            assert ops.index(("F", m)) < ops.index(("B", m))
    order = schedule.simulate(plans)
    assert len(order) == 2 * stages * micro_batches


def test_one_f_one_b_holds_fewer_activations():
    for k in range(4):
        assert schedule.max_in_flight(schedule.gpipe(4, 8, k)) == 8
        assert schedule.max_in_flight(schedule.one_f_one_b(4, 8, k)) == 4 - k


def test_simulate_finds_a_deadlock():
    backwards_first = (("B", 0), ("F", 0))
    with pytest.raises(StrategyConfigError, match="deadlock"):
        schedule.simulate([schedule.gpipe(2, 1, 0), backwards_first])


def test_unknown_schedule_and_bubble():
    with pytest.raises(StrategyConfigError, match="Unknown pipeline schedule"):
        schedule.get_schedule("zigzag", 2, 2, 0)
    assert schedule.bubble_fraction(2, 1) == 0.5
    assert schedule.bubble_fraction(4, 5) == 3 / 8


def test_layout_of_hybrid_job():
    ranks = [PipelineLayout(6, 3, r) for r in range(6)]
    assert [(lay.replica, lay.stage) for lay in ranks] == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert ranks[4].previous == 3 and ranks[4].next == 5 and ranks[4].stage_group == (1, 4)
    assert ranks[0].previous is None and ranks[2].next is None
    assert ranks[5].replica_ranks == (3, 4, 5)


def test_groups_by_axis_keep_their_members_ranks_and_keys():
    for rank in range(6):
        layout = PipelineLayout(6, 3, rank)
        pipe, data = layout.group("pipe"), layout.group("data")
        assert pipe.members == layout.replica_ranks and pipe.rank == layout.stage
        assert data.members == layout.stage_group and data.rank == layout.replica
        # The keys the transport used before the layout named them.
        assert pipe.key == (1 << 18) + layout.replica and data.key == (1 << 19) + layout.stage
        assert layout.world().members == tuple(range(6)) and layout.world().rank == rank
    pair = PipelineLayout(6, 3, 4).pair(3)
    assert pair.key == (1 << 20) + 3 * 4096 + 4 and pair.peer == 3
    with pytest.raises(StrategyConfigError, match="Unknown mesh axis"):
        PipelineLayout(6, 3, 4).group("model")


def test_a_pipeline_split_by_tensor_links_the_same_shard_of_neighbouring_stages():
    # D=2 x K=2 x T=2: rank = (replica * 2 + stage) * 2 + shard.
    layouts = [PipelineLayout(8, 2, rank, tensor=2) for rank in range(8)]
    assert [(lay.replica, lay.stage, lay.coordinates.tensor) for lay in layouts[:4]] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    assert [lay.next for lay in layouts[:4]] == [2, 3, None, None]
    assert [lay.previous for lay in layouts[4:]] == [None, None, 4, 5]
    assert layouts[5].stage_group == (1, 5) and layouts[5].replica_ranks == (5, 7)
    assert layouts[5].group("tensor").members == (4, 5)
    assert layouts[5].group("pipe").key == (1 << 18) + 1 * 2 + 1  # replica 1, shard 1
    assert (layouts[5].replicas, layouts[5].processes_per_replica) == (2, 4)
    with pytest.raises(StrategyConfigError, match="use --workers 4 \\(or 8\\)"):
        PipelineLayout(6, 2, 0, tensor=2)


def test_a_process_holding_every_stage_says_so():
    layout = PipelineLayout(processes=1, stages=3, rank=0, stages_per_process=3)
    assert layout.stages == 3 and layout.held == range(3) and layout.holds_all
    assert layout.is_first and layout.is_last and layout.previous is None and layout.next is None
    assert (layout.replicas, layout.replica, layout.stage) == (1, 0, 0)
    assert layout.group("pipe").size == 1 and layout.group("data").size == 1
    assert PipelineLayout(4, 2, 3).held == range(1, 2)
    assert not PipelineLayout(4, 2, 3).holds_all
    with pytest.raises(StrategyConfigError, match="A process holds one stage or all of them"):
        PipelineLayout(processes=1, stages=4, rank=0, stages_per_process=2)


def test_process_count_must_be_a_multiple_of_stages():
    assert check_processes(4, 2) == 2
    with pytest.raises(StrategyConfigError) as info:
        check_processes(5, 2)
    assert "5 process(es) cannot hold whole pipelines of 2 stages." in str(info.value)
    assert "Fix: use --workers 4 (or 6)" in str(info.value)
    with pytest.raises(StrategyConfigError, match="1 process"):
        check_processes(1, 2)
