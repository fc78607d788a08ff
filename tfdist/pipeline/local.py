"""All K stages of a pipeline in one process, each on its own local device (GPUs, or logical CPUs).

The stages run the same schedules and the same per-stage step code as one process per stage
(`tfdist.pipeline.engine`); only the transfers differ. A `Mailbox` hands each activation and
gradient to the neighbouring stage inside the one traced step (no collectives, no server), and
`LocalPipeline` builds the K stages' ops in an order in which every receive follows its send:
the order `tfdist.pipeline.schedule.simulate` finds for the stages' schedules. Each stage's ops
are placed on its device (``tf.device``); TensorFlow copies a tensor that crosses devices.

Stage ``k``'s engine sees the pipeline as a job of K one-stage processes in which it is rank
``k`` (``PipelineLayout(K, K, k)``): the mailbox addresses its links by those ranks. The process
itself has the layout of one process holding every stage (`LocalPipeline.layout`).

Example:
    >>> from tfdist.parallel.mesh import pair_group
    >>> from tfdist.parallel.keys import ACTIVATION
    >>> mailbox = Mailbox()
    >>> sent = mailbox.link(pair_group(0, 1)).send("activation", ACTIVATION, micro_batch=2)
    >>> mailbox.link(pair_group(1, 0)).recv(None, None, ACTIVATION, micro_batch=2)
    'activation'
    >>> resolve_devices(None, stages=1, processes=1)
    ()
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tfdist.errors import StrategyConfigError, format_error
from tfdist.parallel.keys import EVALUATE, REDUCE, TRAIN
from tfdist.parallel.mesh import ProcessGroup
from tfdist.pipeline import schedule as schedules
from tfdist.pipeline.engine import LossTerms, StageEngine
from tfdist.pipeline.layout import PipelineLayout

__all__ = ["Mailbox", "LocalLink", "LocalPipeline", "resolve_devices", "check_placement"]

_Key = tuple[int, int, int, int, int, int]


class Mailbox:
    """Tensors sent between the stages of one process, within one traced step."""

    def __init__(self) -> None:
        self._box: dict[_Key, Any] = {}

    def link(self, pair: ProcessGroup, timeout: float = 0.0) -> LocalLink:
        """The link from stage ``pair``'s own member to the other (``timeout``: unused, nothing
        waits)."""
        del timeout
        return LocalLink(self, pair.members[pair.rank], pair.peer)

    def put(self, key: _Key, tensor: Any) -> None:
        self._box[key] = tensor

    def take(self, key: _Key) -> Any:
        if key not in self._box:
            source, target, kind, micro_batch, _, _ = key
            raise RuntimeError(
                f"tfdist pipeline: stage {target} receives transfer kind {kind} of micro-batch "
                f"{micro_batch} before stage {source} sent it (the step's ops were built out of "
                "order; this is a tfdist bug)")
        return self._box.pop(key)


@dataclasses.dataclass(frozen=True)
class LocalLink:
    """`tfdist.parallel.ops.Link`'s interface over a `Mailbox`."""

    mailbox: Mailbox
    rank: int
    peer: int

    def send(self, tensor: Any, kind: int, micro_batch: int = 0, index: int = 0,
             phase: int = TRAIN) -> Any:
        """Leaves ``tensor`` for the peer; returns it (a send needs no op of its own)."""
        self.mailbox.put((self.rank, self.peer, kind, micro_batch, index, phase), tensor)
        return tensor

    def recv(self, shape: Any, dtype: Any, kind: int, micro_batch: int = 0, index: int = 0,
             phase: int = TRAIN) -> Any:
        """The tensor the peer sent with the same kind, micro-batch, index and phase."""
        del shape, dtype
        return self.mailbox.take((self.peer, self.rank, kind, micro_batch, index, phase))

    send_sized = send
    """In one process a tensor's shape needs no key of its own (`Link.send_sized`)."""
    recv_sized = recv


@dataclasses.dataclass(frozen=True)
class LocalPipeline:
    """The K stage engines of one process and their devices: the pipeline's engine
    (`tfdist.pipeline.engine.PipelineEngine`) when one process holds every stage (one replica,
    holding the first and the last stage, so sharing and averaging are identities).

    Attributes:
        engines: Stage ``k``'s engine (a layout of K ranks, rank ``k``: see the module).
        devices: Stage ``k``'s device.
    """

    engines: tuple[StageEngine, ...]
    devices: tuple[str, ...]

    @property
    def layout(self) -> PipelineLayout:
        """This process's place: the only one, holding every stage of the only replica."""
        stages = len(self.engines)
        return PipelineLayout(processes=1, stages=stages, rank=0, stages_per_process=stages)

    def _connected(self) -> list[StageEngine]:
        mailbox = Mailbox()  # one per traced step: tensors never cross graphs
        return [dataclasses.replace(e, connect=mailbox.link) for e in self.engines]

    def train(self, calls: Sequence[Callable[[Any], Any]], variables: Sequence[Sequence[Any]],
              x: Any, y: Any, loss_fn: Any, sample_weight: Any = None,
              terms: Sequence[LossTerms | None] | None = None
              ) -> tuple[Any, list[Any], list[Any]]:
        """`StageEngine.train` for all stages: ``calls``, ``variables`` and ``terms`` per stage;
        returns the loss, every stage's gradients in stage order, and the outputs per
        micro-batch."""
        terms = terms or [None] * len(self.engines)
        engines = self._connected()
        steps = []
        for k, engine in enumerate(engines):
            with tf.device(self.devices[k]):
                steps.append(engine.begin(calls[k], variables[k], x, y, loss_fn, sample_weight,
                                          terms[k]))
        for k, op, m, _ in schedules.simulate([engine.ops() for engine in engines]):
            with tf.device(self.devices[k]):
                engines[k].run_op(steps[k], op, m)
        results = []
        for k, (engine, step) in enumerate(zip(engines, steps, strict=True)):
            with tf.device(self.devices[k]):
                results.append(engine.finish(step))
        loss, _, outputs = results[-1]
        return loss, [g for _, grads, _ in results for g in grads], outputs

    def forward(self, calls: Sequence[Callable[[Any], Any]], x: Any, phase: int = EVALUATE,
                terms: Sequence[LossTerms | None] | None = None) -> tuple[list[Any], Any]:
        """`StageEngine.forward` for all stages: the outputs per micro-batch and the stages'
        carried loss terms (None without ``terms``)."""
        result: tuple[list[Any], Any] = ([], None)
        terms = terms or [None] * len(self.engines)
        for k, engine in enumerate(self._connected()):
            with tf.device(self.devices[k]):
                result = engine.forward(calls[k], x, phase, terms[k])
        return result

    @staticmethod
    def replica_rows(tensor: Any) -> Any:
        return tensor

    @staticmethod
    def average_over_replicas(tensors: Sequence[Any], kind: int = REDUCE,
                              phase: int = TRAIN) -> list[Any]:
        del kind, phase
        return list(tensors)

    @staticmethod
    def share(values: Any, shape: Any, dtype: Any, index: int = 0, phase: int = TRAIN,
              sized: bool = False) -> Any:
        del shape, dtype, index, phase, sized
        return values


def _device_name(device: object) -> str:
    """``device`` as TensorFlow spells a local device (``/device:CPU:1``); raises if it is not
    a device string."""
    try:
        spec = tf.DeviceSpec.from_string(device) if isinstance(device, str) else None
    except ValueError:
        spec = None
    if spec is None or spec.device_type is None or spec.job or spec.task:
        raise StrategyConfigError(format_error(
            "A pipeline device must name a local device.", received=f"devices entry {device!r}",
            expected="e.g. '/gpu:0', '/cpu:1' (tf.config.list_logical_devices())",
            fix="pass local device names, one per stage"))
    return f"/device:{spec.device_type.upper()}:{spec.device_index or 0}"


def _auto_devices(stages: int) -> tuple[str, ...] | None:
    """The first ``stages`` local GPUs, else logical CPUs, if there are that many."""
    for kind in ("GPU", "CPU"):
        found = [d.name for d in tf.config.list_logical_devices(kind)]
        if len(found) >= stages:
            return tuple(found[:stages])
    return None


def resolve_devices(devices: Sequence[str] | None, stages: int,
                    processes: int) -> tuple[str, ...]:
    """The device of each stage when one process holds all ``stages``; ``()`` when each process
    holds one stage.

    With ``devices`` None, a single process with ``stages > 1`` takes the first K local GPUs,
    else the first K logical CPUs (``tf.config.set_logical_device_configuration``).

    Raises:
        StrategyConfigError: devices in a job of several processes, not one per stage, not
            local devices of this process, repeated; or too few local devices to pick from.
    """
    if devices is None:
        if processes > 1 or stages == 1:
            return ()
        found = _auto_devices(stages)
        if found is None:
            raise StrategyConfigError(format_error(
                f"{stages} pipeline stages in one process need {stages} local devices.",
                received=f"stages={stages} in a single process with "
                f"{len(tf.config.list_logical_devices('GPU'))} GPU(s) and "
                f"{len(tf.config.list_logical_devices('CPU'))} logical CPU(s)",
                expected=f"{stages} GPUs or logical CPUs, or {stages} processes",
                fix=f"tfdist-launch --strategy pipeline --stages {stages} --workers {stages} "
                f"train.py, or pass devices=[...] ({stages} names), or create logical CPUs "
                "with tf.config.set_logical_device_configuration before TensorFlow starts"))
        return found
    return _check_devices(devices, stages, processes)


def _check_devices(devices: Sequence[str], stages: int, processes: int) -> tuple[str, ...]:
    if processes > 1:
        raise StrategyConfigError(format_error(
            "devices= places every stage in one process; this job has several.",
            received=f"devices={list(devices)} with {processes} processes",
            expected="devices in a single process, or none in a multi-process job",
            fix="drop devices= (each process then holds one stage), or run one process"))
    if isinstance(devices, str) or len(devices) != stages:
        raise StrategyConfigError(format_error(
            "devices must name one device per stage.",
            received=f"devices={devices!r}, stages={stages}", expected=f"{stages} device names",
            fix=f"pass a list of {stages} devices, e.g. {[f'/cpu:{k}' for k in range(stages)]}"))
    names = tuple(_device_name(d) for d in devices)
    present = {d.name for d in tf.config.list_logical_devices()}
    missing = [d for d, name in zip(devices, names, strict=True) if name not in present]
    if missing or len(set(names)) != len(names):
        raise StrategyConfigError(format_error(
            "Each stage needs its own device of this process.",
            received=f"devices={list(devices)} (absent: {missing})",
            expected=f"distinct names among {sorted(present)}",
            fix="name distinct local devices; create logical CPUs with "
            "tf.config.set_logical_device_configuration before TensorFlow starts"))
    return names


def _placed_on(variable: Any) -> str:
    device = getattr(variable, "device", None) or variable.value.device  # Keras 3: .value
    spec = tf.DeviceSpec.from_string(device)
    return f"/device:{spec.device_type}:{spec.device_index}"


def check_placement(stage_weights: Sequence[Sequence[Any]], devices: Sequence[str]) -> None:
    """Raises unless stage ``k``'s variables all sit on ``devices[k]``.

    Raises:
        StrategyConfigError: some did not (built inside a strategy's scope, which places every
            variable on its own device).
    """
    for k, (weights, device) in enumerate(zip(stage_weights, devices, strict=True)):
        wrong = sorted({_placed_on(w) for w in weights} - {device})
        if wrong:
            raise StrategyConfigError(format_error(
                f"Stage {k}'s variables are not on its device.",
                received=f"stage {k} on {wrong}", expected=f"on {device}",
                fix="call strategy.build_model(...) outside any strategy.scope(): a scope "
                "places every variable on its own device"))
