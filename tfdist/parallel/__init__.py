"""The model-parallel substrate: the job's mesh, this process's place on it, and collectives.

What `tfdist.pipeline` and `tfdist.tensor` (and any later model-parallel scheme) are built on,
in the shape of Megatron-LM's ``parallel_state``; nothing here imports either of them.

* `tfdist.parallel.mesh`: the job's processes on ``data x pipe x tensor`` (`Mesh`), the
  collective group of each axis, of each pair and of the whole job (`ProcessGroup`, its group
  key); TensorFlow-free, the launcher plans with it;
* `tfdist.parallel.place`: this process's place, read once per process from ``TFDIST_MESH`` and
  TF_CONFIG (`process_place`): "my group on this axis", "my rank on it" (`MeshPlace`);
  TensorFlow-free;
* `tfdist.parallel.keys`: the one allocator of instance keys (named and traced);
* `tfdist.parallel.runtime`: start TensorFlow's collective runtime, join it within a deadline,
  the exit barrier;
* `tfdist.parallel.ops`: send/recv (`Link`), broadcast, all-reduce (sum, mean, max),
  all-gather, reduce-scatter on a group;
* `tfdist.parallel.mappings`: Megatron's tensor-parallel mappings (copy to, reduce from,
  scatter to, gather from the group), each with its gradient.

This package imports only its TensorFlow-free modules; import the others by name.

Example:
    >>> from tfdist.parallel import Mesh, place_of
    >>> place = place_of(processes=4, rank=3, tensor=2)
    >>> place.mesh == Mesh(data=2, tensor=2), place.group("tensor").members
    (True, (2, 3))
"""

from tfdist.parallel.mesh import (
           AXES,
           DATA,
           MESH_ENV,
           PIPE,
           TENSOR,
           Axis,
           Coordinates,
           Mesh,
           ProcessGroup,
)
from tfdist.parallel.place import MeshPlace, place_of, process_place

__all__ = ["AXES", "DATA", "MESH_ENV", "PIPE", "TENSOR", "Axis", "Coordinates", "Mesh",
           "MeshPlace", "ProcessGroup", "place_of", "process_place"]
