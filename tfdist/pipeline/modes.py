"""The pipeline's two modes, chosen once when the strategy is made (`choose_mode`).

* `StagePerProcess`: each process of a job of D x K holds one stage; its engine is a
  `StageEngine` whose neighbours are other processes (collectives, `tfdist.pipeline.transport`).
* `StagesOnDevices`: one process holds all K stages, stage ``k`` on local device ``k``; its
  engine is a `LocalPipeline` of K stage engines linked in-process.
* `ChunksPerProcess` (a multi-chunk schedule: ``"interleaved"``): each process of a job of D x K
  holds v of the model's K x v pieces (`tfdist.pipeline.interleave`).

Each answers the `PipelineMode` interface: the process's `PipelineLayout` (K stages in both; the
second holds them all), its devices, a description of where its stages are, and the Keras model
of its stages with the engine (`tfdist.pipeline.engine.PipelineEngine`) attached. The strategy
asks its mode and never branches on which one it has.

Example:
    >>> from tfdist.pipeline.config import PipelineConfig
    >>> mode = choose_mode(PipelineConfig(), processes=1, rank=0)
    >>> type(mode).__name__, mode.where(), mode.devices
    ('StagePerProcess', 'stage 0 of 1, replica 0 of 1', ())
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Protocol

import tensorflow as tf

from tfdist.core.flavour import get_keras
from tfdist.errors import StrategyConfigError, format_error
from tfdist.pipeline import interleave, local, stage, tied
from tfdist.pipeline.config import PipelineConfig
from tfdist.pipeline.engine import StageEngine
from tfdist.pipeline.keras_model import local_stages_model, stage_model_class
from tfdist.pipeline.layout import PipelineLayout

__all__ = ["PipelineMode", "StagePerProcess", "StagesOnDevices", "ChunksPerProcess", "choose_mode",
           "stage_engine"]


class PipelineMode(Protocol):
    """Where this process's stages live, and how their model is built."""

    @property
    def layout(self) -> PipelineLayout:
        """This process's place in the job (``layout.held``: the stages it holds)."""
        ...

    @property
    def devices(self) -> tuple[str, ...]:
        """Stage ``k``'s device when this process holds every stage, else ``()``."""
        ...

    @property
    def pieces(self) -> tuple[int, ...]:
        """The pieces of the split model this process holds, in the order of its stage models
        (its stages; with interleaving, its chunks)."""
        ...

    def where(self) -> str:
        """Where this process's stages are, in words (`PipelineStrategy.describe`)."""
        ...

    def build(self, spec: stage.ModelSpec, bounds: tuple[int, ...], strategy: Any,
              layer_maker: Any = None) -> Any:
        """The Keras model of this process's stages, its engine attached; ``strategy`` is the
        `PipelineStrategy` the model reports to; ``layer_maker`` makes each layer
        (`tfdist.pipeline.stage.build_stage`; a tensor-split stage's makes its shards)."""
        ...

    def sync_tied(self, model: Any) -> None:
        """Gives every stage holding a weight tied across stages the first holder's values (a
        collective of the holders)."""
        ...


def whole_model_scope(spec: stage.ModelSpec) -> Any:
    """Keras 3: the whole model's name scope, so that a stage's variables have the paths (and
    TensorFlow names) they have in the whole model, which name-based optimizer options match
    (``exclude_from_weight_decay(var_names=...)``). tf-keras names no model in them."""
    if spec.flavour != "keras3":
        return contextlib.nullcontext()
    return get_keras("keras3").name_scope(spec.name)


def stage_engine(config: PipelineConfig, spec: stage.ModelSpec, bounds: tuple[int, ...],
                 layout: PipelineLayout) -> StageEngine:
    """The engine of ``layout.stage`` (the tensors its cuts carry, from the split model)."""
    cuts, k = spec.cuts(bounds), layout.stage
    return StageEngine(
        layout=layout, inputs=spec.boundary(cuts[k - 1]) if k > 0 else (),
        outputs=spec.boundary(cuts[k]) if k < len(cuts) else (),
        micro_batches=config.micro_batches, schedule=config.schedule,
        timeout=config.timeout or 0.0, recompute=config.recompute,
        whole_batch_weights=config.weight_gradients == "whole_batch")


@dataclasses.dataclass(frozen=True)
class StagePerProcess:
    """One stage per process (a job of D x K processes, or one process and K = 1)."""

    config: PipelineConfig
    layout: PipelineLayout
    devices: tuple[str, ...] = ()

    @property
    def pieces(self) -> tuple[int, ...]:
        return tuple(self.layout.held)

    def where(self) -> str:
        layout = self.layout
        return (f"stage {layout.stage} of {layout.stages}, replica {layout.replica} of "
                f"{layout.replicas}")

    def build(self, spec: stage.ModelSpec, bounds: tuple[int, ...], strategy: Any,
              layer_maker: Any = None) -> Any:
        """This stage's layers (or, split by tensor parallelism, their shards), made in
        ``strategy.scope()``."""
        with strategy.scope(), whole_model_scope(spec):
            model = stage.build_stage(spec, bounds, self.layout.stage,
                                      cls=stage_model_class(spec.flavour),
                                      layer_maker=layer_maker)
        engine = stage_engine(self.config, spec, bounds, self.layout)
        tied_weights = tied.tied_for_stage(spec, bounds, self.layout, model,
                                           self.config.timeout or 0.0)
        model._init_pipeline(engine, strategy, tied_weights if tied_weights.entries else None)  # noqa: SLF001
        return model

    def sync_tied(self, model: Any) -> None:
        """Gives every holder of a tied weight its first holder's values."""
        if model._pipeline_tied is not None:  # noqa: SLF001
            model._pipeline_tied.sync(model.trainable_variables)  # noqa: SLF001


@dataclasses.dataclass(frozen=True)
class StagesOnDevices:
    """Every stage in this one process, stage ``k`` on ``devices[k]``."""

    config: PipelineConfig
    layout: PipelineLayout
    devices: tuple[str, ...]

    @property
    def pieces(self) -> tuple[int, ...]:
        return tuple(self.layout.held)

    def where(self) -> str:
        return f"{self.layout.stages} stages on {', '.join(self.devices)}"

    def build(self, spec: stage.ModelSpec, bounds: tuple[int, ...], strategy: Any,
              layer_maker: Any = None) -> Any:
        """Stage ``k``'s variables on ``devices[k]``, made outside ``strategy.scope()``, whose
        one device would hold them all."""
        stages = []
        for k, device in enumerate(self.devices):
            with tf.device(device), whole_model_scope(spec):
                stages.append(stage.build_stage(spec, bounds, k, layer_maker=layer_maker))
        local.check_placement([s.weights for s in stages], self.devices)
        model = local_stages_model(spec.flavour, stages, self.devices, spec.name)
        count = self.layout.stages
        engines = tuple(stage_engine(self.config, spec, bounds, PipelineLayout(count, count, k))
                        for k in range(count))
        summed, sync = tied.tied_for_local(spec, bounds, stages)
        model._init_pipeline(local.LocalPipeline(engines, self.devices), strategy,  # noqa: SLF001
                             summed)
        model._pipeline_sync_tied = sync  # noqa: SLF001
        return model

    def sync_tied(self, model: Any) -> None:
        """Gives every holder of a tied weight its first holder's values."""
        model._pipeline_sync_tied()  # noqa: SLF001


@dataclasses.dataclass(frozen=True)
class ChunksPerProcess:
    """v chunks per process (interleaved 1F1B): pieces ``k, k + K, ...`` of K x v."""

    config: PipelineConfig
    layout: PipelineLayout
    device: str = "/cpu:0"

    @property
    def devices(self) -> tuple[str, ...]:
        return ()

    @property
    def pieces(self) -> tuple[int, ...]:
        return interleave.pieces(self.layout.stages, self.config.chunks, self.layout.stage)

    def where(self) -> str:
        layout = self.layout
        return (f"stage {layout.stage} of {layout.stages} (pieces {list(self.pieces)} of "
                f"{self.config.pieces}), replica {layout.replica} of {layout.replicas}")

    def build(self, spec: stage.ModelSpec, bounds: tuple[int, ...], strategy: Any,
              layer_maker: Any = None) -> Any:
        """This process's chunks, made outside ``strategy.scope()`` on its device (a model
        holding several stage models compiles outside it, `local_stages_model`)."""
        _refuse_shared_layers(spec, bounds)
        chunks = []
        for piece in self.pieces:
            with tf.device(self.device), whole_model_scope(spec):
                chunks.append(stage.build_stage(spec, bounds, piece, layer_maker=layer_maker))
        model = local_stages_model(spec.flavour, chunks, (self.device,) * len(chunks),
                                   spec.name)
        cuts = [spec.boundary(tensors) for tensors in spec.cuts(bounds)]
        process = StageEngine(layout=self.layout, inputs=(), outputs=(),
                              micro_batches=self.config.micro_batches,
                              schedule=self.config.schedule, timeout=self.config.timeout or 0.0,
                              recompute=self.config.recompute)
        model._init_pipeline(  # noqa: SLF001
            interleave.interleaved_engine(process, self.config.chunks, cuts), strategy)
        return model

    def sync_tied(self, model: Any) -> None:
        del model  # `build` refuses weights shared between pieces


def _refuse_shared_layers(spec: stage.ModelSpec, bounds: tuple[int, ...]) -> None:
    """Raises if a layer is called in two pieces (tied weights): not supported interleaved."""
    seen: dict[int, int] = {}
    for piece in range(len(bounds) - 1):
        for lid in stage.stage_layers(spec, bounds, piece):
            if lid in seen:
                raise StrategyConfigError(format_error(
                    "The interleaved schedule cannot tie a layer's weights across pieces.",
                    received=f"layer {spec.layers[lid].name!r} in pieces {seen[lid]} and "
                    f"{piece}", expected="each layer called in one piece",
                    fix="use schedule='1f1b' (ties weights across stages), or split_points "
                    "that keep the layer's calls in one piece"))
            seen[lid] = piece


def choose_mode(config: PipelineConfig, processes: int, rank: int,
                tensor: int = 1) -> PipelineMode:
    """`StagesOnDevices` when this single process holds the stages (``config.devices``, or
    K > 1 in one process), else `StagePerProcess` (each stage on ``tensor`` processes).

    Raises:
        StrategyConfigError: devices that do not fit (`local.resolve_devices`) or given with
            ``tensor > 1``, or a process count that is not a multiple of K x T.
    """
    multi_chunk = config.schedule_class.multi_chunk
    if tensor > 1 and multi_chunk:
        raise StrategyConfigError(format_error(
            f"The {config.schedule} schedule does not split stages by tensor parallelism.",
            received=f"schedule={config.schedule!r}, tensor={tensor}", expected="tensor=1",
            fix="use tensor=1, or schedule='1f1b' with tensor parallelism"))
    if tensor > 1:  # each stage on T processes: never all stages in one
        if config.devices is not None:
            raise StrategyConfigError(format_error(
                "Stages split by tensor parallelism are each held by T processes, not by the "
                "devices of one process.", received=f"devices={list(config.devices)}, "
                f"tensor={tensor}", expected="devices=None",
                fix="drop devices (one process per shard of each stage), or use tensor=1"))
        return StagePerProcess(config, PipelineLayout(processes, config.stages, rank,
                                                      tensor=tensor))
    if multi_chunk:
        return ChunksPerProcess(config, PipelineLayout(processes, config.stages, rank))
    devices = local.resolve_devices(config.devices, config.stages, processes)
    if devices:
        layout = PipelineLayout(processes, config.stages, rank,
                                stages_per_process=config.stages)
        return StagesOnDevices(config, layout, devices)
    return StagePerProcess(config, PipelineLayout(processes, config.stages, rank))
