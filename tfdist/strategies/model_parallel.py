"""What the strategies that split one model across processes share (``pipeline``, ``tensor``).

Every process of such a job runs the same script on the whole global batch (each step takes its
part), finds its place on the job's mesh from ``TF_CONFIG``, joins TensorFlow's collective runtime
within the start-up deadline, waits for the others at a normal exit (task 0 leads every
collective's resolution), and saves the whole model from the chief.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from tfdist.compat import shuffle
from tfdist.errors import StrategyConfigError, format_error
from tfdist.logs import report_written
from tfdist.parallel import runtime
from tfdist.parallel.mesh import DATA, ProcessGroup
from tfdist.parallel.place import (
    TENSOR_SHARDS_ENV,
    MeshPlace,
    Shards,
    process_place,
    tensor_shards,
)
from tfdist.strategies import model_calls, rendezvous
from tfdist.strategies.startup import startup_deadline

__all__ = ["ModelParallelMixin", "tensor_shards"]

_splits = [0]
"""How many models the model-parallel strategies of this process have split (`build_model`)."""
_KERAS_DISTRIBUTION = "_tfdist_keras_distribution"
"""Where `tfdist.kdist` records the ``keras.distribution.ModelParallel`` a model was made under
(it splits the model at its first ``fit``)."""



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

    @property
    def mesh(self) -> Any:
        """The job's process mesh (this process's place on it: ``self.place``)."""
        return self.place.mesh

    @property
    def data_group(self) -> Any:
        return self.place.group(DATA)

    @property
    def num_replicas(self) -> int:
        """D: the data-parallel replicas whose gradients make one step."""
        return self.place.size_of(DATA)

    @property
    def num_workers(self) -> int:
        return self.mesh.size

    @property
    def worker_index(self) -> int:
        return self.place.rank

    def _join_collectives(self, deadline: float | None, cluster: Any, task: Any,
                          world: ProcessGroup) -> None:
        """Joins the job's collective runtime (at most ``deadline`` s) and, at exit, waits for
        every process of ``world`` (`tfdist.parallel.runtime.join`)."""
        name = type(self).__name__
        runtime.join(cluster, task, world,
                     startup_deadline(deadline, cluster, task, f"{name} on {task}"))
        self._tfdist_world = world
        if world.size > 1:
            model_calls.claim_job(self)

    @staticmethod
    def _device() -> str:
        return "/cpu:0" if not tf.config.list_physical_devices("GPU") else "/gpu:0"

    def input_context(self) -> tf.distribute.InputContext:
        """Every process reads the whole global batch (each step takes its replica's rows), so
        its one input pipeline batches by the global batch size."""
        return tf.distribute.InputContext(
            num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=1)

    def _distribute_dataset_fn(self, dataset_fn: Any, options: Any) -> Any:
        dataset = dataset_fn(self.input_context())
        with contextlib.suppress(AttributeError):  # a model fit on it must be this one's
            dataset._tfdist_distributed_by = self  # noqa: SLF001
        return dataset

    def experimental_distribute_dataset(self, dataset: tf.data.Dataset,
                                        options: Any = None) -> tf.data.Dataset:
        """The dataset itself: one replica on this process's one device, which ``fit`` (both
        Kerases) iterates as it is. ``OneDeviceStrategy``'s distributed dataset would prefetch
        to that device through a ``MultiDeviceIterator`` built and torn down in every ``fit``
        call (tf-keras, 2 stages, 4 steps a call: 0.31 s a call against 0.15 s without)."""
        del options  # nothing to place: no device to fetch to but the one the data is on
        shuffle.release()  # a fit's input pipeline is built: its permutation took the seed
        return dataset

    def model_call_scope(self, model: Any, method: str,
                         call: Mapping[str, Any]) -> contextlib.AbstractContextManager[Any]:
        """An array ``fit`` that Keras shuffles, with no global seed: the seed the job agrees
        (`tfdist.compat.shuffle`), so every process reads the same global batches."""
        del model
        world: ProcessGroup | None = getattr(self, "_tfdist_world", None)
        if method != "fit" or not shuffle.shuffles_arrays(call) or \
                shuffle.global_seed() is not None:
            return contextlib.nullcontext()
        calls: dict[str, int] = self.__dict__.setdefault("_tfdist_calls", {})
        calls["shuffled_fit"] = call_number = calls.get("shuffled_fit", 0) + 1
        rank, size = (world.rank, world.size) if world is not None else (0, 1)
        seed = shuffle.agree_seed(rank, size, call_number, self.timeout or 300.0)
        return shuffle.seeded_fit(seed)

    def _mark_split(self, model: Any) -> Any:
        """``model``, recorded as this strategy's split (`check_model_call` accepts it)."""
        model._tfdist_split_by = self  # noqa: SLF001
        _splits[0] += 1
        return model

    def check_unscoped_fit(self, model: Any, call: Mapping[str, Any]) -> None:
        """Refuses ``model.fit`` on a model made and called outside every strategy's scope
        while this process has split no model yet (`build_model`): in a job of several
        processes, each would train its own whole model, silently. After `build_model`, such a
        model is taken for what a test script makes on purpose: one process's reference."""
        del call
        if getattr(model, _KERAS_DISTRIBUTION, None) is not None:
            _splits[0] += 1  # made under keras.distribution's ModelParallel: `tfdist.kdist`
            return  # splits it at this fit; it is the job's model
        if _splits[0]:  # by any strategy of this process (a script may make several)
            return
        name = self.name  # type: ignore[attr-defined]
        self._refuse_unsplit(
            model, "fit", "made outside strategy.build_model, before any model of this job was "
            "split", f"fit outside every tfdist strategy's scope in a {name} job of "
            f"{self.num_workers} processes",
            fix="model = strategy.build_model(build_fn), where build_fn() builds the whole "
                "model; then compile and fit that model. A model meant to train in this "
                "process alone (a one-process reference) is accepted once strategy.build_model "
                "has made the job's model: build it after")

    def check_model_call(self, model: Any, method: str, call: Mapping[str, Any]) -> None:
        """Refuses, at ``compile``/``fit``/``evaluate``/``predict``, a model made in this
        strategy's scope that `build_model` did not split: every process would train all of it,
        unsplit, and `save_model` could not assemble it. Before ``evaluate``/``predict`` (a
        collective of every process), waits for every process to make the same call and refuses
        at once when one has ended instead (called on the chief alone)."""
        name = self.name  # type: ignore[attr-defined]
        if getattr(model, "_tfdist_split_by", None) is not self:
            self._refuse_unsplit(model, method, "made whole in strategy.scope()",
                                 f"made in the {name} strategy's scope")
        if method in self.collective_calls:
            self._every_process_calls(
                f"model.{method}", f"model.{method} under {name} runs on every process of "
                "the job (each holds part of the model)",
                expected=f"model.{method} called on every process (each returns the whole "
                         "model's result on the whole input)",
                fix=f"call model.{method} on every process, not under `if strategy.is_chief`; "
                    "print or save its result on the chief alone")

    def check_model_from_outside(self, model: Any, method: str,
                                 call: Mapping[str, Any]) -> None:
        """Refuses a model made outside any strategy's scope (not by `build_model`), compiled
        or fit in this strategy's scope or on the input its ``distribute_dataset`` made."""
        del call
        if getattr(model, "_tfdist_split_by", None) is not self:
            self._refuse_unsplit(model, method, "made outside strategy.build_model",
                                 "made outside any tfdist strategy's scope")

    def _refuse_unsplit(self, model: Any, method: str, how: str, received: str,
                        fix: str | None = None) -> None:
        name = self.name  # type: ignore[attr-defined]
        raise StrategyConfigError(format_error(
            f"Under {name!r} a model must come from strategy.build_model(...): this one was "
            f"{how}, so model.{method} would run all of it on every process, unsplit.",
            received=f"a {type(model).__name__} {received}",
            expected="the model strategy.build_model(build_fn) returns",
            fix=fix or "model = strategy.build_model(build_fn), where build_fn() builds the "
                "whole model; then compile and fit that model (the same lines run under every "
                "strategy)"))

    def save_model(self, model: Any, filepath: str | os.PathLike[str], **kwargs: Any) -> str | None:
        """Saves the whole model: every process calls it, the chief writes ``filepath``, a
        ``.keras`` file that ``keras.models.load_model`` opens in one process.

        Where ``filepath`` cannot be written the model is saved to a new temporary directory
        and the error names it (`SavingMixin.save_model`).

        Returns:
            ``filepath`` on the chief, None elsewhere.

        Raises:
            StrategyConfigError: A process of the job reached its end (or failed) without
                calling it: gathering the model needs every process. Or ``filepath`` cannot be
                written (the model is then saved elsewhere, named in the message).
        """
        self._every_process_saves()
        whole = self.assemble(model)  # type: ignore[attr-defined]
        if whole is None:
            return None
        path = os.fspath(filepath)
        self._save_or_rescue(whole, path, path, kwargs,  # type: ignore[attr-defined]
                             collective=False)
        report_written("model", path)
        return path

    def _every_process_saves(self) -> None:
        """Waits until every process of the job has called `save_model` (this is its Nth call);
        refuses at once when one of them reached its exit instead (`runtime.EXIT_KEY`)."""
        self._every_process_calls(
            "save_model", "save_model gathers the model from every process of the job",
            expected="every process calls save_model (the chief writes the file)",
            fix="call strategy.save_model(model, path) on every process, not under "
                "`if strategy.is_chief` (it returns None on the others)")

    def _every_process_calls(self, what: str, why: str, expected: str, fix: str) -> None:
        """Waits until every process of the job has made this call of ``what`` (its Nth, as
        here); raises at once when a peer reached its exit instead (`runtime.EXIT_KEY`), or
        when it has not made it within the strategy's timeout (300 s where it has none).

        Raises:
            StrategyConfigError: A peer ended (or failed) before the call, or never made it.
        """
        world: ProcessGroup | None = getattr(self, "_tfdist_world", None)
        if world is None:
            return
        rendezvous.every_process_calls(
            self.__dict__.setdefault("_tfdist_calls", {}), world.rank, world.size, what,
            why=why, expected=expected, fix=fix,
            limit=self.timeout or 300.0)  # the pipeline's 0: transfers wait without a limit
