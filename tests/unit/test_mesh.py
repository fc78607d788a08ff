"""`tfdist.parallel.mesh.Mesh`: coordinates, groups and keys of a data x pipe x tensor job."""

from __future__ import annotations

import itertools

import pytest

from tfdist.errors import StrategyConfigError
from tfdist.parallel.mesh import AXES, Mesh

pytestmark = pytest.mark.unit

MESHES = [Mesh(), Mesh(tensor=4), Mesh(data=2, pipe=3), Mesh(2, 2, 2), Mesh(3, 2, 4)]


@pytest.mark.parametrize("mesh", MESHES, ids=repr)
def test_every_rank_has_one_place_and_back(mesh):
    places = [mesh.coordinates(rank) for rank in range(mesh.size)]
    assert len(set(places)) == mesh.size
    assert [mesh.rank_of(*place) for place in places] == list(range(mesh.size))


@pytest.mark.parametrize("mesh", MESHES, ids=repr)
def test_groups_partition_the_job_on_each_axis_with_one_key_per_group(mesh):
    for axis in AXES:
        groups = {mesh.group(axis, rank).members: mesh.group(axis, rank).key
                  for rank in range(mesh.size)}
        members = sorted(itertools.chain.from_iterable(groups))
        assert members == list(range(mesh.size)), axis  # each rank in exactly one group
        assert len(set(groups.values())) == len(groups), axis  # keys unique on the axis
        assert all(len(group) == getattr(mesh, axis) for group in groups)
        for rank in range(mesh.size):  # a group's members differ only along the axis
            group = mesh.group(axis, rank)
            here = mesh.coordinates(rank)
            assert group.members[group.rank] == rank
            for i, other in enumerate(group.members):
                assert mesh.coordinates(other)._replace(**{axis: 0}) == here._replace(**{axis: 0})
                assert getattr(mesh.coordinates(other), axis) == i


def test_keys_differ_across_axes_pairs_and_world():
    mesh = Mesh(2, 2, 2)
    keys = {mesh.group(axis, rank).key for axis in AXES for rank in range(8)}
    keys |= {mesh.pair(a, b).key for a in range(8) for b in range(8) if a != b}
    keys.add(mesh.world(0).key)
    assert len(keys) == 3 * 4 + 28 + 1


def test_tensor_groups_are_neighbouring_ranks_so_they_share_a_host():
    mesh = Mesh(data=2, pipe=2, tensor=4)
    assert mesh.group("tensor", 5).members == (4, 5, 6, 7)


def test_without_tensor_the_pipeline_keys_are_unchanged():
    # The pipeline's layout (one group per replica on "pipe", per stage on "data") keeps its
    # keys: a job started by an older tfdist and one by this one agree.
    from tfdist.pipeline.layout import PipelineLayout

    mesh = Mesh.for_processes(6, pipe=3)
    for rank in range(6):
        layout = PipelineLayout(processes=6, stages=3, rank=rank)
        for axis in ("data", "pipe"):
            assert mesh.group(axis, rank) == layout.group(axis)


@pytest.mark.parametrize("processes,pipe,tensor,fragment", [
    (6, 2, 2, "use --workers 4 (or 8)"), (2, 1, 4, "use --workers 4"),
])
def test_counts_that_do_not_divide_are_refused_with_the_fix(processes, pipe, tensor, fragment):
    with pytest.raises(StrategyConfigError, match="processes=") as err:
        Mesh.for_processes(processes, pipe=pipe, tensor=tensor)
    assert fragment in str(err.value)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_a_bad_axis_size_names_the_axis(bad):
    with pytest.raises(StrategyConfigError, match="tensor="):
        Mesh(tensor=bad)


def test_a_rank_outside_the_mesh_is_refused():
    with pytest.raises(StrategyConfigError, match="rank=8"):
        Mesh(2, 2, 2).coordinates(8)
