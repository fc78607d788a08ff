"""What the strategies that split one model across processes share (``pipeline``, ``tensor``).

Every process of such a job runs the same script on the whole global batch (each step takes its
part), finds its place on the job's mesh from ``TF_CONFIG``, joins TensorFlow's collective runtime
within the start-up deadline, waits for the others at a normal exit (task 0 leads every
collective's resolution), and saves the whole model from the chief.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from tfdist.errors import StrategyConfigError, format_error
from tfdist.logs import report_written
from tfdist.parallel import runtime
from tfdist.parallel.mesh import ProcessGroup
from tfdist.parallel.place import (
    TENSOR_SHARDS_ENV,
    MeshPlace,
    Shards,
    process_place,
    tensor_shards,
)
from tfdist.strategies.startup import startup_deadline

__all__ = ["ModelParallelMixin", "tensor_shards"]


class ModelParallelMixin:
    """Mixed into a `TfdistStrategyMixin` + ``OneDeviceStrategy`` subclass that defines
    ``assemble(model)`` (the whole model on the chief, None elsewhere)."""

    collective_calls = ("evaluate", "predict")  # each process holds part of the model

    def _job_place(self, tf_config: str | Mapping[str, Any] | None, tensor: Shards | None,
                   default_tensor: Shards) -> tuple[Any, Any, MeshPlace]:
        """``(cluster, task, place)`` of this process (`tfdist.parallel.place.process_place`:
        ``TFDIST_MESH`` and TF_CONFIG, ``tensor`` overriding); no cluster and a place of one
        process when there is no ``TF_CONFIG``."""
        if tf_config is None and not os.environ.get("TF_CONFIG"):
            alone = {k: v for k, v in os.environ.items() if k == TENSOR_SHARDS_ENV}
            return None, None, process_place(tensor=tensor, default_tensor=default_tensor,
                                             environ=alone)
        cluster, task = self._read_cluster(tf_config)  # type: ignore[attr-defined]
        return cluster, task, process_place(tf_config, tensor=tensor,
                                            default_tensor=default_tensor)

    def _join_collectives(self, deadline: float | None, cluster: Any, task: Any,
                          world: ProcessGroup) -> None:
        """Joins the job's collective runtime (at most ``deadline`` s) and, at exit, waits for
        every process of ``world`` (`tfdist.parallel.runtime.join`)."""
        name = type(self).__name__
        runtime.join(cluster, task, world,
                     startup_deadline(deadline, cluster, task, f"{name} on {task}"))

    @staticmethod
    def _device() -> str:
        return "/cpu:0" if not tf.config.list_physical_devices("GPU") else "/gpu:0"

    def input_context(self) -> tf.distribute.InputContext:
        """Every process reads the whole global batch (each step takes its replica's rows), so
        its one input pipeline batches by the global batch size."""
        return tf.distribute.InputContext(
            num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=1)

    def _distribute_dataset_fn(self, dataset_fn: Any, options: Any) -> Any:
        return dataset_fn(self.input_context())

    def experimental_distribute_dataset(self, dataset: tf.data.Dataset,
                                        options: Any = None) -> tf.data.Dataset:
        """The dataset itself: one replica on this process's one device, which ``fit`` (both
        Kerases) iterates as it is. ``OneDeviceStrategy``'s distributed dataset would prefetch
        to that device through a ``MultiDeviceIterator`` built and torn down in every ``fit``
        call (tf-keras, 2 stages, 4 steps a call: 0.31 s a call against 0.15 s without)."""
        del options  # nothing to place: no device to fetch to but the one the data is on
        return dataset

    def _mark_split(self, model: Any) -> Any:
        """``model``, recorded as this strategy's split (`check_model_call` accepts it)."""
        model._tfdist_split_by = self  # noqa: SLF001
        return model

    def check_model_call(self, model: Any, method: str, call: Mapping[str, Any]) -> None:
        """Refuses, at ``compile``/``fit``/``evaluate``/``predict``, a model made in this
        strategy's scope that `build_model` did not split: every process would train all of it,
        unsplit, and `save_model` could not assemble it."""
        if getattr(model, "_tfdist_split_by", None) is self:
            return
        name = self.name  # type: ignore[attr-defined]
        raise StrategyConfigError(format_error(
            f"Under {name!r} a model must come from strategy.build_model(...): this one was "
            f"made whole in strategy.scope(), so model.{method} would run all of it on every "
            "process, unsplit.",
            received=f"a {type(model).__name__} made in the {name} strategy's scope",
            expected="the model strategy.build_model(build_fn) returns",
            fix="model = strategy.build_model(build_fn), where build_fn() builds the whole "
                "model; then compile and fit that model (the same lines run under every "
                "strategy)"))

    def save_model(self, model: Any, filepath: str | os.PathLike[str], **kwargs: Any) -> str | None:
        """Saves the whole model: every process calls it, the chief writes ``filepath``, a
        ``.keras`` file that ``keras.models.load_model`` opens in one process.

        Returns:
            ``filepath`` on the chief, None elsewhere.
        """
        whole = self.assemble(model)  # type: ignore[attr-defined]
        if whole is None:
            return None
        path = os.fspath(filepath)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        whole.save(path, **kwargs)
        report_written("model", path)
        return path
