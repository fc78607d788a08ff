"""`tfdist.parallel`: one instance-key allocator whose two spaces never meet, this process's place
read once (``TFDIST_MESH`` first, arguments overriding, a hand-set shard count only without a
mesh), T carried by the launcher in the mesh alone (issue 41), and the ops on a group of one."""

from __future__ import annotations

import json

import pytest

from tfdist.core.traits import TENSOR_SHARDS_ENV
from tfdist.errors import StrategyConfigError
from tfdist.launcher.options import JobOptions, StrategyOptions
from tfdist.launcher.plan import plan_job
from tfdist.parallel import MESH_ENV, Mesh, keys, place, place_of, process_place

pytestmark = pytest.mark.unit


def _tf_config(workers: int, index: int) -> str:
    return json.dumps({"cluster": {"worker": [f"h:{i}" for i in range(workers)]},
                       "task": {"type": "worker", "index": index}})


# ----------------------------------------------------------------- instance keys
def test_the_largest_named_key_sits_right_below_the_first_traced_one():
    top = keys.instance_key(keys.EXIT, micro_batch=4095, index=4095, phase=7)
    assert top == keys.TRACED - 1 == (1 << 30) - 1
    traced = [keys.next_key() for _ in range(3)]
    assert min(traced) >= keys.TRACED and traced == list(range(traced[0], traced[0] + 3))
    assert {keys.space(top), *map(keys.space, traced)} == {"named", "traced"}


def test_named_keys_of_every_kind_and_phase_are_distinct():
    named = {keys.instance_key(kind, m, i, phase)
             for kind in range(8) for phase in range(4) for m in (0, 1, 4095) for i in (0, 4095)}
    assert len(named) == 8 * 4 * 3 * 2 and max(named) < keys.TRACED


@pytest.mark.parametrize(("field", "value"), [("micro_batch", 4096), ("index", -1),
                                              ("kind", 8), ("phase", 8)])
def test_a_field_out_of_its_bits_is_refused_rather_than_colliding(field, value):
    # Unchecked, the bits spill: micro-batch 4096 of ACTIVATION would be its micro-batch 0,
    # 8192 a WEIGHTS transfer.
    assert keys.ACTIVATION << 24 | 4096 << 12 == keys.instance_key(keys.ACTIVATION)
    assert keys.ACTIVATION << 24 | 8192 << 12 == keys.instance_key(keys.WEIGHTS)
    fields = {"kind": keys.ACTIVATION, "micro_batch": 0, "index": 0, "phase": keys.TRAIN}
    with pytest.raises(StrategyConfigError) as err:
        keys.instance_key(**{**fields, field: value})
    assert f"{field}={value}" in str(err.value) and "Fix:" in str(err.value)


def test_the_pipelines_transport_and_the_tensor_layers_share_the_one_allocator():
    from tfdist.parallel import mappings
    from tfdist.pipeline import transport

    assert transport.instance_key is keys.instance_key
    assert transport.STOP_VOTE == keys.STOP_VOTE == keys.instance_key(keys.EXIT, 1)
    assert mappings.next_key is keys.next_key


# ----------------------------------------------------------------- the place
def test_the_mesh_in_the_environment_wins_over_a_stale_shard_count():
    env = {MESH_ENV: "data=1,pipe=1,tensor=2", TENSOR_SHARDS_ENV: "1",
           "TF_CONFIG": _tf_config(2, 1)}
    found = process_place(environ=env, default_tensor="all")
    assert (found.mesh, found.rank, found.rank_on("tensor")) == (Mesh(tensor=2), 1, 1)
    # The same environment without the mesh: the stale count decides (the bug the mesh stops).
    del env[MESH_ENV]
    assert process_place(environ=env, default_tensor="all").mesh == Mesh(data=2)


def test_arguments_override_the_environment_and_defaults_fill_the_rest():
    env = {MESH_ENV: "data=2,pipe=1,tensor=2", "TF_CONFIG": _tf_config(4, 2)}
    assert process_place(environ=env, tensor=4).mesh == Mesh(tensor=4)
    assert process_place(environ=env, tensor=1).mesh == Mesh(data=4)
    bare = {"TF_CONFIG": _tf_config(4, 3)}
    assert process_place(environ=bare).mesh == Mesh(data=4)
    assert process_place(environ=bare, default_tensor="all").mesh == Mesh(tensor=4)
    assert process_place(environ={**bare, TENSOR_SHARDS_ENV: "2"}).mesh == Mesh(data=2, tensor=2)
    assert process_place(environ={}, default_tensor="all").mesh == Mesh()


@pytest.mark.parametrize(("env", "kwargs", "fragment"), [
    ({TENSOR_SHARDS_ENV: "x"}, {}, "positive int"),
    ({}, {"tensor": 0}, "shards=0"),
    ({MESH_ENV: "tensor=3"}, {}, "disagree on the number of processes"),
    ({}, {"tensor": 3}, "cannot hold whole model replicas"),
])
def test_a_place_that_cannot_be_is_refused_with_the_fix(env, kwargs, fragment):
    with pytest.raises(StrategyConfigError) as err:
        process_place(environ={"TF_CONFIG": _tf_config(4, 0), **env}, **kwargs)
    assert fragment in str(err.value) and "Fix:" in str(err.value)


def test_the_environment_is_parsed_once_per_process():
    env = {MESH_ENV: "data=1,pipe=2,tensor=1", "TF_CONFIG": _tf_config(2, 0)}
    process_place(environ=env)
    before = place._read.cache_info()
    for _ in range(5):
        process_place(environ=env)
    after = place._read.cache_info()
    assert (after.hits - before.hits, after.misses - before.misses) == (5, 0)


def test_the_place_answers_what_the_mesh_says():
    mesh = Mesh(data=2, pipe=2, tensor=2)
    for rank in range(mesh.size):
        here = place_of(8, rank, pipe=2, tensor=2)
        assert here.mesh == mesh and here.coordinates == mesh.coordinates(rank)
        for axis in ("data", "pipe", "tensor"):
            assert here.group(axis) == mesh.group(axis, rank)
            assert here.rank_on(axis) == getattr(mesh.coordinates(rank), axis)
            assert here.size_of(axis) == 2
        assert here.world() == mesh.world(rank) and here.is_chief == (rank == 0)


def test_the_pipeline_layout_is_a_place():
    from tfdist.pipeline.layout import PipelineLayout

    layout = PipelineLayout(processes=8, stages=2, rank=5, tensor=2)
    assert layout.place == place_of(8, 5, pipe=2, tensor=2)
    assert layout.group("tensor") == layout.place.group("tensor")
    assert layout.pair(7) == layout.place.pair(7) and layout.replica == 1


# ----------------------------------------------------------------- T across the boundary
def test_the_launcher_writes_t_in_the_mesh_alone_whatever_the_shell_holds():
    stale = {TENSOR_SHARDS_ENV: "1"}
    plan = plan_job(JobOptions("t.py", strategy="tensor", workers=2), environ=stale)
    assert plan.mesh == Mesh(tensor=2) and plan.env[MESH_ENV] == "data=1,pipe=1,tensor=2"
    assert TENSOR_SHARDS_ENV not in plan.env
    task = {**stale, **plan.env, "TF_CONFIG": _tf_config(2, 1)}  # what worker:1 sees
    assert process_place(environ=task, default_tensor="all").size_of("tensor") == 2
    asked = plan_job(JobOptions("t.py", strategy="tensor", workers=4,
                                strategy_options=StrategyOptions(tensor=2)), environ=stale)
    assert asked.env[MESH_ENV] == "data=2,pipe=1,tensor=2" and TENSOR_SHARDS_ENV not in asked.env
    pipeline = plan_job(JobOptions("t.py", strategy="pipeline", workers=2), environ=stale)
    assert pipeline.env[MESH_ENV] == "data=2,pipe=1,tensor=1"


def test_a_strategy_off_the_mesh_gets_none():
    plan = plan_job(JobOptions("t.py", strategy="multi_worker", workers=2), environ={})
    assert plan.mesh is None and MESH_ENV not in plan.env


# ----------------------------------------------------------------- ops on a group of one
def test_every_op_on_a_group_of_one_is_the_identity():
    import numpy as np
    import tensorflow as tf

    from tfdist.parallel import mappings, ops

    alone = Mesh().group("tensor", 0)
    x = tf.constant([[1.0, -2.0, 3.0, 4.0]])
    for op in ("sum", "mean", "max"):
        np.testing.assert_array_equal(ops.all_reduce(x, alone, op), x)
    np.testing.assert_array_equal(ops.all_gather(x, alone, axis=1), x)
    np.testing.assert_array_equal(ops.reduce_scatter(x, alone, axis=1), x)
    for mapping in (mappings.copy_to_group, mappings.reduce_from_group,
                    mappings.scatter_to_group, mappings.gather_from_group):
        np.testing.assert_array_equal(mapping(x, alone), x)
    with pytest.raises(StrategyConfigError, match="op='min'"):
        ops.all_reduce(x, alone, "min")


def test_sized_keys_hold_one_shape_each_and_meet_no_named_key():
    # TensorFlow keeps one shape per instance key for the life of a job (a second shape:
    # "Shape mismatch in the collective instance"): a tensor whose length changes travels
    # flat, padded to its size class, on the key of that class.
    import tensorflow as tf

    from tfdist.parallel.ops import size_class

    sizes = [*range(0, 600), 4095, 4096, 4097, 10**6, 2**30 - 3]
    classes = [keys.capacity(n) for n in sizes]
    assert all(n <= cap <= max(n * 1.25, n) for n, (_, cap) in zip(sizes, classes, strict=True))
    assert [c for c, _ in classes] == sorted(c for c, _ in classes)  # one class, one capacity
    assert len({cap for _, cap in classes}) == len({c for c, _ in classes})
    assert max(c for c, _ in classes) < keys.SIZE_CLASSES
    # Every size in one call of one graph (a call per size: 1 CPU-s of call overhead)
    traced = tf.function(lambda ns: tf.map_fn(lambda n: tf.stack(size_class(n)), ns))
    in_graph = traced(tf.constant(sizes)).numpy()
    for n, expected, got in zip(sizes, classes, in_graph, strict=True):
        assert tuple(int(v) for v in got) == expected, n
    named = {keys.instance_key(kind, m, i, phase)
             for kind in range(8) for phase in range(8) for m in (0, 1, 4095) for i in (0, 31)}
    sized = set()
    for kind in (keys.ACTIVATION, keys.GRADIENT, keys.WEIGHTS):
        for m, i in ((0, 0), (1, 31), (0, 31)) if kind != keys.WEIGHTS else ((0, 0), (0, 4095)):
            key, stride = keys.sized_key(kind, m, i)
            sized |= {key + c * stride for c in range(keys.SIZE_CLASSES)}
    assert not sized & named and min(sized) >= keys.SIZED > keys.TRACED  # CHECK is phase 4
    assert {keys.space(k) for k in sized} == {"sized"} and max(sized) < 1 << 31
    assert len(sized) == 2 * 3 * keys.SIZE_CLASSES + 2 * keys.SIZE_CLASSES
    with pytest.raises(StrategyConfigError, match="at most 32 of them"):
        keys.sized_key(keys.ACTIVATION, 0, 32)
