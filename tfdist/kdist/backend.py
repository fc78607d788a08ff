"""Keras's distribution API made real on the TensorFlow backend, over tfdist's engines.

`install` fills in what Keras's TensorFlow ``distribution_lib`` lacks (``initialize``,
``num_processes``, ``process_id``, ``distribute_tensor``, ...) and wraps
``set_distribution`` (which ``Distribution.scope()`` calls too):

Made (or set), a distribution joins the job: TensorFlow allows that only before its first
operation, as JAX's ``initialize`` must come before any computation.

* ``DataParallel``: this process joins the job as a tfdist ``multi_worker`` replica, and the
  strategy is made TensorFlow's default while the distribution is set, so a model created
  then is mirrored and ``model.fit`` all-reduces its gradients;
* ``ModelParallel``: this process joins as a tfdist ``tensor`` process on the mesh the
  ``DeviceMesh`` lays out (`tfdist.kdist.mesh`); a model created while it is set is made this
  process's shard at its first ``compile`` (or ``predict``), in place, by the LayoutMap
  (`tfdist.kdist.layout` and `tfdist.kdist.shard`).

One distribution per process (TensorFlow configures its collectives once): another one of a
different kind or mesh is refused with the fix.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from tfdist.errors import StrategyConfigError, format_error
from tfdist.kdist import job as job_lib
from tfdist.kdist.mesh import job_mesh, model_axis_of
from tfdist.parallel.mesh import Mesh

__all__ = ["install", "state", "active_strategy", "job_devices", "mesh_of"]


@dataclasses.dataclass
class _State:
    job: job_lib.Job | None = None
    kind: str | None = None
    mesh: Mesh | None = None
    strategy: Any = None
    default_set: bool = False


state = _State()
_installed: list[bool] = []


def _job() -> job_lib.Job:
    if state.job is None:
        state.job = job_lib.job_of()
    return state.job


def _local_type() -> str:
    import tensorflow as tf

    return "gpu" if tf.config.list_physical_devices("GPU") else "cpu"


def job_devices(device_type: str | None = None) -> list[str]:
    """The job's devices in rank order, one per process (Keras's ``"cpu:0"`` form)."""
    local = _local_type()
    kind = (device_type or local).lower()
    if kind != local and not (kind == "cpu" and local == "gpu"):
        return []
    return job_lib.device_names(_job(), kind if device_type else local)


# ---------------------------------------------------------------- the backend's functions
def initialize(job_addresses: Any = None, num_processes: int | None = None,
               process_id: int | None = None) -> None:
    """Joins the launched job (arguments checked against it), or the job the arguments name
    (written as this process's TF_CONFIG; a deadline for the coordinator to answer)."""
    from tfdist.strategies.startup import resolve_startup_timeout

    addresses = job_lib.parse_addresses(job_addresses)
    launched = job_lib.job_of()
    if launched.launched:
        job_lib.check_arguments(launched, addresses, num_processes, process_id)
        state.job = launched
        return
    if not addresses and num_processes in (None, 1) and process_id in (None, 0):
        state.job = launched
        return
    job = job_lib.unlaunched_job(addresses, num_processes, process_id)
    job_lib.apply(job)
    state.job = job
    job_lib.wait_for_coordinator(job, resolve_startup_timeout(None))


def num_processes() -> int:
    return _job().processes


def process_id() -> int:
    return _job().process_id


def list_devices(device_type: str | None = None) -> list[str]:
    return job_devices(device_type)


def get_device_count(device_type: str | None = None) -> int:
    return len(job_devices(device_type))


def distribute_tensor(tensor: Any, layout: Any) -> Any:
    """The tensor itself: tfdist's engines place activations (a layout is a hint)."""
    del layout
    return tensor


def distribute_value(value: Any, tensor_layout: Any) -> Any:
    del tensor_layout
    return value


def distribute_variable(value: Any, layout: Any) -> Any:
    del layout
    return value


def distribute_data_input(per_process_batch: Any, layout: Any, batch_dim_name: str) -> Any:
    del layout, batch_dim_name
    return per_process_batch


def _to_backend_mesh(device_mesh: Any) -> Mesh:
    """The tfdist mesh a DeviceMesh lays out (its first axis as the batch axis)."""
    names = tuple(device_mesh.axis_names)
    return job_mesh(device_mesh.shape, names, list(device_mesh.devices.flatten()),
                    job_devices(), names[0] if len(names) <= 2 else None)


def _to_backend_layout(tensor_layout: Any) -> tuple[Any, ...]:
    return tuple(tensor_layout.axes)


_FUNCTIONS = (initialize, num_processes, process_id, list_devices, get_device_count,
              distribute_tensor, distribute_value, distribute_variable, distribute_data_input,
              _to_backend_mesh, _to_backend_layout)


# ---------------------------------------------------------------- distributions
def mesh_of(distribution: Any) -> tuple[str, Mesh]:
    """``(kind, mesh)``: the tfdist strategy and process mesh ``distribution`` runs on."""
    from keras.distribution import ModelParallel

    device_mesh = distribution.device_mesh
    devices = [str(d) for d in device_mesh.devices.flatten()]
    if isinstance(distribution, ModelParallel):
        mesh = job_mesh(device_mesh.shape, device_mesh.axis_names, devices, job_devices(),
                        distribution.batch_dim_name)
        return "tensor", mesh
    return "multi_worker", job_mesh(device_mesh.shape, device_mesh.axis_names, devices,
                                    job_devices(), None)


def _make_strategy(kind: str, mesh: Mesh) -> Any:
    try:
        return _new_strategy(kind, mesh)
    except RuntimeError as err:
        if "at program startup" not in str(err):
            raise
        raise StrategyConfigError(format_error(
            "This process joins the job's collectives when its Keras distribution is made, and "
            "TensorFlow allows that only before its first operation runs.",
            received=f"a {kind} distribution made after TensorFlow ran ({err})",
            expected="keras.distribution.initialize() and the Distribution first",
            fix="make the DataParallel/ModelParallel (and set_distribution) at the top of the "
                "script, before building datasets, tensors or models")) from err


def _new_strategy(kind: str, mesh: Mesh) -> Any:
    if kind == "tensor":
        from tfdist.strategies.tensor import TensorStrategy

        return TensorStrategy(shards=mesh.tensor)
    from tfdist.strategies.multi_worker import MultiWorkerMirroredStrategy

    return MultiWorkerMirroredStrategy()


def active_strategy(distribution: Any) -> Any:
    """The tfdist strategy ``distribution`` runs on in this process (made on first use; None
    for a job of one process).

    Raises:
        StrategyConfigError: the mesh does not fit the job, or this process already joined
            the job for another kind of distribution or another mesh.
    """
    kind, mesh = mesh_of(distribution)
    if mesh.size == 1:
        return None
    if state.kind is None:
        state.strategy = _make_strategy(kind, mesh)
        state.kind, state.mesh = kind, mesh
        return state.strategy
    if (state.kind, state.mesh) != (kind, mesh):
        raise StrategyConfigError(format_error(
            "This process already joined the job for another Keras distribution: TensorFlow "
            "sets up its collectives once per process.",
            received=f"{type(distribution).__name__} on {mesh}; earlier: {state.kind} on "
            f"{state.mesh}",
            expected="one distribution (one kind, one mesh) per process",
            fix="make one Distribution at the start of the script and set it once (reuse it "
                "with distribution.scope())"))
    return state.strategy


def _activate(value: Any) -> None:
    import tensorflow as tf
    from keras.distribution import ModelParallel

    if state.default_set:
        tf.distribute.experimental_set_strategy(None)
        state.default_set = False
    if value is None:
        return
    if isinstance(value, ModelParallel):
        model_axis_of(value.device_mesh.axis_names, value.batch_dim_name)
    strategy = active_strategy(value)
    if strategy is not None and state.kind == "multi_worker":
        tf.distribute.experimental_set_strategy(strategy)
        state.default_set = True


def _wrap_set_distribution(original: Any) -> Any:
    if getattr(original, "__tfdist__", False):
        return original

    def set_distribution(value: Any) -> None:
        _activate(value)
        original(value)

    set_distribution.__doc__ = original.__doc__
    set_distribution.__tfdist__ = True  # type: ignore[attr-defined]
    return set_distribution


def _wrap_init(original: Any) -> Any:
    if getattr(original, "__tfdist__", False):
        return original

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        active_strategy(self)  # join the job now: before TensorFlow runs anything

    __init__.__doc__ = original.__doc__
    __init__.__tfdist__ = True  # type: ignore[attr-defined]
    return __init__


def _wrap_distribute_dataset(original: Any) -> Any:
    def distribute_dataset(self: Any, dataset: Any) -> Any:
        """The global batches, as ``fit`` takes them here: ``DataParallel``'s multi_worker
        strategy gives each process its rows of every global batch inside ``fit``, and
        ``ModelParallel``'s tensor engine gives each data replica its rows (every process of a
        tensor group reads the same batch). Keras's own (JAX) form, each process its shard, fed
        to those would shard twice."""
        import tensorflow as tf

        if self.num_processes == 1:
            return original(self, dataset)
        return dataset.prefetch(tf.data.AUTOTUNE)

    distribute_dataset.__tfdist__ = True  # type: ignore[attr-defined]
    return distribute_dataset


def install() -> None:
    """Makes ``keras.distribution`` real on the TensorFlow backend (once; nothing on another
    backend, or with ``TFDIST_KERAS_DISTRIBUTION=off``)."""
    import keras

    from tfdist.kdist import shard

    if _installed or keras.backend.backend() != "tensorflow" or not enabled():
        return
    from keras.src.backend.tensorflow import distribution_lib as backend_lib
    from keras.src.distribution import distribution_lib as keras_lib

    for function in _FUNCTIONS:
        setattr(backend_lib, function.__name__, function)
    keras_lib.set_distribution = _wrap_set_distribution(keras_lib.set_distribution)
    for name in ("keras.distribution", "keras.api.distribution", "keras._tf_keras.keras."
                 "distribution"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "set_distribution"):
            module.set_distribution = keras_lib.set_distribution
    for cls in (keras_lib.DataParallel, keras_lib.ModelParallel):
        cls.__init__ = _wrap_init(cls.__init__)
    base = keras_lib.Distribution
    if not getattr(base.distribute_dataset, "__tfdist__", False):
        base.distribute_dataset = _wrap_distribute_dataset(base.distribute_dataset)
    shard.install()
    _installed.append(True)


def enabled() -> bool:
    """False when ``TFDIST_KERAS_DISTRIBUTION`` is ``off`` (or ``0``/``false``/``no``)."""
    import os

    return os.environ.get("TFDIST_KERAS_DISTRIBUTION", "").strip().lower() not in (
        "off", "0", "false", "no")
