"""A Keras ``DeviceMesh`` as tfdist's process mesh: the batch axis is ``data``, the model axis
``tensor`` (`tfdist.parallel.mesh.Mesh`).

Each process of a launched job is one device of Keras's mesh (`tfdist.kdist.job.device_names`:
``"cpu:0"``.. in rank order). tfdist's rank order puts ``tensor`` fastest
(``rank = d * T + t``), so a mesh is accepted when its devices sit where those ranks do: the
batch axis first and ``keras.distribution.list_devices()`` in its order, as Keras's guide and
KerasHub's recipes write it. Anything else is refused with the fix before any process waits.

TensorFlow-free (no Keras import either: the callers pass the mesh's fields).

Example:
    >>> devices = ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]
    >>> job_mesh((2, 2), ("batch", "model"), devices, devices, data_axis="batch")
    Mesh(data=2, pipe=1, tensor=2)
    >>> job_mesh((4,), ("batch",), devices, devices, data_axis=None)
    Mesh(data=4, pipe=1, tensor=1)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tfdist.errors import StrategyConfigError, format_error
from tfdist.parallel.mesh import Mesh

__all__ = ["job_mesh", "model_axis_of"]


def model_axis_of(axis_names: Sequence[str], data_axis: str) -> str | None:
    """The mesh's model axis (the one that is not ``data_axis``), None on a 1-D mesh.

    Raises:
        StrategyConfigError: ``data_axis`` is not one of ``axis_names``, or there are more than
            two axes (tfdist's Keras meshes are data x model).

    Example:
        >>> model_axis_of(("batch", "model"), "batch"), model_axis_of(("data",), "data")
        ('model', None)
    """
    names = tuple(axis_names)
    if data_axis not in names:
        raise StrategyConfigError(format_error(
            "ModelParallel's batch_dim_name is not an axis of its DeviceMesh.",
            received=f"batch_dim_name={data_axis!r}, axis_names={names}",
            expected=f"one of {names}",
            fix=f"ModelParallel(layout_map=..., batch_dim_name={names[0]!r}), or name the mesh's "
                "axes ('batch', 'model')"))
    if len(names) > 2:
        raise StrategyConfigError(format_error(
            "tfdist lays a Keras DeviceMesh out as data x model: at most two axes.",
            received=f"axis_names={names}", expected="(batch_dim_name, model_axis)",
            fix="DeviceMesh(shape=(D, T), axis_names=('batch', 'model')); for pipeline stages "
                "use tfdist's pipeline strategy"))
    rest = [n for n in names if n != data_axis]
    return rest[0] if rest else None


def job_mesh(shape: Sequence[int], axis_names: Sequence[str], devices: Sequence[str],
             job_devices: Sequence[str], data_axis: str | None) -> Mesh:
    """The `Mesh` a Keras mesh of ``devices`` lays out on the job's processes.

    Args:
        shape: The DeviceMesh's shape.
        axis_names: Its axis names.
        devices: Its devices, flattened (row-major, as Keras reshapes them).
        job_devices: The job's devices in rank order (`device_names`).
        data_axis: The batch axis; None: every axis is data (``DataParallel``).

    Raises:
        StrategyConfigError: the mesh's size is not the job's process count, a device is not
            one of the job's, or the devices are not in rank order with the batch axis first.
    """
    shape, names, devices = tuple(int(s) for s in shape), tuple(axis_names), list(devices)
    size, processes = math.prod(shape), len(job_devices)
    if size != processes:
        raise StrategyConfigError(format_error(
            f"The DeviceMesh has {size} devices; the job has {processes} process(es), one "
            "device each.",
            received=f"DeviceMesh(shape={shape}, axis_names={names})",
            expected=f"a shape whose product is {processes}",
            fix=f"DeviceMesh(shape=({processes},) or (D, T) with D * T = {processes}, ..., "
                f"devices=keras.distribution.list_devices()), or launch with tfdist-launch "
                f"--workers {size}"))
    unknown = [d for d in devices if d not in job_devices]
    if unknown:
        raise StrategyConfigError(format_error(
            "The DeviceMesh names devices that are not the job's.",
            received=f"devices {unknown[:4]}", expected=f"devices among {list(job_devices)}",
            fix="pass devices=keras.distribution.list_devices()"))
    if data_axis is None:
        mesh = Mesh(data=size)
    else:
        model_axis = model_axis_of(names, data_axis)
        tensor = shape[names.index(model_axis)] if model_axis is not None else 1
        mesh = Mesh(data=size // tensor, tensor=tensor)
        if model_axis is not None and names.index(data_axis) != 0 and min(shape) > 1:
            _refuse_order(shape, names, data_axis)
    if devices != list(job_devices):
        _refuse_order(shape, names, data_axis or names[0])
    return mesh


def _refuse_order(shape: tuple[int, ...], names: tuple[str, ...], data_axis: str) -> None:
    raise StrategyConfigError(format_error(
        "The DeviceMesh's devices are not in the job's rank order with the batch axis first: "
        "tfdist places a tensor group on neighbouring ranks (rank = d * T + t).",
        received=f"DeviceMesh(shape={shape}, axis_names={names}), batch axis {data_axis!r}",
        expected="the batch axis first and devices=keras.distribution.list_devices()",
        fix="DeviceMesh(shape=(D, T), axis_names=('batch', 'model'), "
            "devices=keras.distribution.list_devices())"))
