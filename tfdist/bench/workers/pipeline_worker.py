"""Times training steps of one deep MLP under ``--mode pipeline`` (one process per stage, from
TF_CONFIG), ``multi_worker`` (same processes, data parallel) or ``default`` (one process).

Usage: ``python -m tfdist.bench.workers.pipeline_worker --mode pipeline --micro-batches 4``
(``--schedule``: any of `tfdist.pipeline.schedule.SCHEDULES`; ``--chunks 2``: interleaved 1F1B,
two chunks per process). A schedule's bound is ``(M + idle slots)`` times the process's work on
one micro-batch over all its chunks, the idle slots simulated by the schedule
(`PipelineSchedule.idle_slots`: ``K - 1`` for GPipe and 1F1B, ``(K-1)/v`` interleaved, about a
third of ``K - 1`` for ZB-H1, whose forward, input gradient and weight gradient of a Dense layer
are one matrix product each).
Under ``pipeline`` each process times, in alternating rounds, its own stage alone (forward and
backward of one micro-batch, no transfers) and the pipelined step of the custom-loop path
(``strategy.train_step``): GPipe's bound of a step is ``(M + K - 1)`` times the slowest stage's
time, and alternating keeps both medians under the same machine load (this machine is shared).
Every mode then times one ``fit`` over ``--steps`` global batches (after a warm-up fit) with a
callback that stamps each step's end: ``step_s`` is the median steady step (end to end, the
first step left out), ``fit_first_step_s`` the first, ``fit_call_s`` what the call spends
outside its steps (tf-keras's data adapter, distributed dataset and iterator, callbacks: a fixed
cost per ``fit`` call, not per step), and ``fit_whole_step_s`` the whole call over ``--steps``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from tfdist.bench.workers import exit_after
from tfdist.probe.common import apply_threads, median, time_call
from tfdist.testing import report

FEATURES = 256


def build(keras: Any, width: int, depth: int) -> Any:
    """``depth`` equal Dense layers of ``width`` units: stages of equal cost for any even K."""
    layers = [keras.Input((FEATURES,))]
    layers += [keras.layers.Dense(width if i < depth - 1 else FEATURES, activation="relu",
                                  name=f"dense_{i}") for i in range(depth)]
    return keras.Sequential(layers, name="deep_mlp")


def target(x: Any) -> Any:
    """What the model learns to output for inputs ``x``."""
    return x * 0.5


def stage_alone(model: Any, rows: int) -> Any:
    """A ``tf.function``: this stage's work on one micro-batch of ``rows`` rows, no transfers.

    The work a stage does per micro-batch in a pipelined step: forward, backward (weights and
    input), and adding the weight gradients into the step's sums.
    """
    import tensorflow as tf

    first = getattr(model, "pipeline_stages", [model])[0]  # chunks: the first one's input
    x = tf.random.normal([rows, *first.inputs[0].shape[1:]])
    sums = [tf.Variable(tf.zeros_like(v), trainable=False) for v in model.trainable_variables]

    @tf.function
    def step() -> Any:
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = model(x, training=True)
            total = tf.reduce_sum(out)
        *grads, back = tape.gradient(total, [*model.trainable_variables, x])
        return [s.assign_add(g) for s, g in zip(sums, grads, strict=True)], back

    return step


def interleaved(step: Any, alone: Any, slots: float, rounds: int = 6, per_round: int = 4,
                other: Any = None) -> dict[str, float]:
    """``step()`` and ``alone()`` (and ``other()``, if given) timed in alternating rounds under
    the same machine load.

    Returns the medians of both, and ``over_bound``: the median over rounds of one round's step
    median over ``slots`` times the stage median of the round just before it (the ratio of
    neighbouring measurements is steadier than the ratio of medians on a shared machine); with
    ``other``, its median (``other_step_s``) and ``over_other``, the median over rounds of the
    step's median over ``other``'s in the same round.
    """
    step(), alone()
    if other is not None:
        other()
    steps: list[float] = []
    stages: list[float] = []
    ratios: list[float] = []
    others: list[float] = []
    against: list[float] = []
    for _ in range(rounds):
        stage_round = [time_call(alone) for _ in range(per_round)]
        step_round = [time_call(step) for _ in range(per_round)]
        ratios.append(median(step_round) / (slots * median(stage_round)))
        steps += step_round
        stages += stage_round
        if other is not None:
            other_round = [time_call(other) for _ in range(per_round)]
            against.append(median(step_round) / median(other_round))
            others += other_round
    result = {"loop_step_s": median(steps), "stage_s": median(stages),
              "over_bound": median(ratios)}
    if other is not None:
        result.update(other_step_s=median(others), over_other=median(against))
    return result


def step_under(strategy: Any, model: Any, keras: Any, schedule: str) -> Any:
    """The custom-loop step of the same stages under another one-chunk ``schedule``: the
    model's engine swapped for the call that builds it (the step keeps the engine it was
    built with), so both schedules are timed in one job, under the same load."""
    import dataclasses

    engine = model._engine  # noqa: SLF001
    model._engine = dataclasses.replace(engine, schedule=schedule)  # noqa: SLF001
    try:
        return strategy.train_step(model, "mse", keras.optimizers.SGD(1e-4))
    finally:
        model._engine = engine  # noqa: SLF001


def pipeline_seconds(strategy: Any, model: Any, keras: Any, x: Any, y: Any,
                     micro_batches: int, rounds: int, compare: str | None = None
                     ) -> dict[str, float]:
    """The pipelined step (custom loop) and the stage alone (and the step under the schedule
    ``compare``), timed in alternating rounds."""
    import tensorflow as tf

    step = strategy.train_step(model, "mse", keras.optimizers.SGD(1e-4))
    other = None if compare is None else step_under(strategy, model, keras, compare)
    xs, ys = tf.constant(x), tf.constant(y)
    rows = len(x) // (micro_batches * strategy.num_replicas)
    config = strategy.config
    slots = micro_batches + config.schedule_class(config.stages, micro_batches,
                                                  config.chunks).idle_slots()
    return interleaved(lambda: float(step(xs, ys)), stage_alone(model, rows), slots, rounds,
                       other=None if other is None else lambda: float(other(xs, ys)))


def fit_seconds(model: Any, keras: Any, x: Any, y: Any, batch: int) -> dict[str, float]:
    """One ``fit`` over ``x`` timed per step by a callback: the steady step apart from the
    first step and from the call's fixed cost outside its steps."""
    stamps: list[float] = []

    class StepClock(keras.callbacks.Callback):  # type: ignore[misc, name-defined]
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            if not stamps:
                stamps.append(time.perf_counter())

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            stamps.append(time.perf_counter())

    whole = time_call(lambda: model.fit(x, y, batch_size=batch, epochs=1, verbose=0,
                                        shuffle=False, callbacks=[StepClock()]))
    steps = list(np.diff(stamps))
    return {"step_s": median(steps[1:] or steps), "fit_first_step_s": float(steps[0]),
            "fit_call_s": whole - (stamps[-1] - stamps[0]),
            "fit_whole_step_s": whole / len(steps)}


def main(argv: Sequence[str] | None = None) -> str:
    """Measures and reports; returns ``--mode``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("pipeline", "multi_worker", "default"),
                        required=True)
    parser.add_argument("--micro-batches", type=int, default=1)
    parser.add_argument("--chunks", type=int, default=1)
    parser.add_argument("--schedule", default="gpipe")
    parser.add_argument("--compare", default=None,
                        help="pipeline: also time this schedule's step in the same rounds")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=6,
                        help="pipeline: alternating rounds of steps and stage-alone runs")
    args = parser.parse_args(argv)
    apply_threads()
    import tfdist
    from tfdist.core import flavour

    keras = flavour.get_keras()
    options: dict[str, Any] = {}
    if args.mode == "pipeline":
        options.update(micro_batches=args.micro_batches, schedule=args.schedule)
    if args.chunks > 1:
        options["chunks"] = args.chunks
    strategy = tfdist.get_strategy(args.mode, **options)
    model = strategy.build_model(lambda: build(keras, args.width, args.depth))
    result: dict[str, Any] = {"mode": args.mode, "processes": strategy.num_workers}
    samples = args.batch * args.steps
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, FEATURES)).astype("float32")
    if args.mode == "pipeline":
        result.update(pipeline_seconds(strategy, model, keras, x[: args.batch],
                                       target(x[: args.batch]), args.micro_batches,
                                       args.rounds, args.compare))
        result["stage"] = strategy.stage_report()
    model.compile(optimizer=keras.optimizers.SGD(1e-4), loss="mse")
    if args.mode == "multi_worker":  # each worker reads its half of every global batch
        per = args.batch // strategy.num_replicas
        x = x.reshape(args.steps, strategy.num_replicas, per, FEATURES)[:, strategy.worker_index]
        x, batch = x.reshape(-1, FEATURES), per
    else:
        batch = args.batch
    y = target(x)
    model.fit(x[: batch * 3], y[: batch * 3], batch_size=batch, epochs=1, verbose=0,
              shuffle=False)  # warm-up; a shuffle gives stages other batches (refused)
    result.update(fit_seconds(model, keras, x, y, batch))
    report(result)
    return args.mode


if __name__ == "__main__":
    exit_after(main())
