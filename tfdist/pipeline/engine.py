"""One pipelined training step of a process's stages, built from a schedule (graph code, no
Keras API): the one engine of every schedule, one chunk per process or several.

`StageEngine` holds what a stage process knows: its `PipelineLayout`, the tensors the cuts at
its boundaries, the number of micro-batches and its schedule. A process that holds several
chunks (interleaved 1F1B) has one `StageEngine` per chunk (each seeing the pipeline as ``K v``
stages, `tfdist.pipeline.interleave.ChunkLayout`) in its own engine's ``chunk_engines``; the
schedule's actions ``(op, micro_batch, chunk)`` run on their chunk's engine, in one loop
(`run_actions`), whatever the schedule. Its methods build the ops of a step inside the caller's
``tf.function`` (Keras's ``train_step``, or a custom loop):

* `train` runs the schedule: for ``("F", m)`` it takes micro-batch ``m`` (stage 0) or receives it
  from the previous stage, runs the stage under a ``GradientTape`` and sends the output on (or,
  on the last stage, takes the loss); for ``("B", m)`` it receives the output's gradient (or
  differentiates the loss), accumulates the weight gradients and sends the input's gradient
  back. Each op is chained to the previous one with a control dependency, so a stage runs its
  schedule in order (1F1B then really keeps at most ``K - stage`` micro-batches' activations);
  sends and receives are asynchronous kernels outside that chain, so no stage waits for a send
  to be taken. Every send is tied to the step's outputs: one that nothing uses would be pruned
  from the ``tf.function`` and its receiver would wait for ever. Each op kind has its handler
  (`OP_HANDLERS`): a split backward's ``("I", m)`` and ``("W", m)`` are in
  `tfdist.pipeline.split_backward`.
* `forward` runs forwards only (evaluate, predict).
* A stage's losses beyond the compiled one (`LossTerms`): the weight regularizers are
  differentiated once per step (in `finish`); the losses a call adds (activity regularizers,
  each a mean over the call's rows, as both Kerases make them) join micro-batch ``m``'s
  backward pass, divided by ``M`` like the loss. Each stage adds its terms' values to the sum it
  receives from the previous stage and sends it on (`carry`), so the last stage reports the
  compiled loss plus every stage's terms, as Keras reports ``loss`` on one device.
* `share` broadcasts the last stage's values (loss, metrics, predictions) to the other stages of
  its pipeline replica, `average_over_replicas` averages over the D replicas of a stage.

The loss of micro-batch ``m`` is its mean loss divided by ``M``, and the stage gradients are
summed over micro-batches then averaged over replicas: one step equals one step of the whole
model on the whole global batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tfdist.parallel.keys import sized_key
from tfdist.parallel.mesh import DATA, PIPE, ProcessGroup
from tfdist.parallel.ops import sized_broadcast
from tfdist.pipeline import batch_weights, gradients, transport
from tfdist.pipeline import schedule as schedules
from tfdist.pipeline.interface import LossFn, LossTerms, PipelineEngine, StageStep
from tfdist.pipeline.interleave import ChunkLink
from tfdist.pipeline.layout import PipelineLayout
from tfdist.pipeline.schedule import run_actions
from tfdist.pipeline.split_backward import input_gradient_op, weight_gradient_op
from tfdist.pipeline.transport import (
    ACTIVATION,
    EVALUATE,
    GRADIENT,
    REDUCE,
    SHARE,
    TRAIN,
    BoundaryTensor,
    Link,
    instance_key,
    recv_boundary,
    send_boundary,
)

__all__ = ["PipelineEngine", "StageEngine", "StageStep", "LossTerms", "OP_HANDLERS", "run_actions"]

TERMS_INDEX = 4095
"""The carried loss terms travel as the last tensor index (4095) of micro-batch 0's ACTIVATION
transfer; the tensors a cut carries take indices ``0..n-1``."""


@dataclasses.dataclass(frozen=True)
class StageEngine:
    """The step-building logic of a process's one stage, or of its chunks (``chunk_engines``).

    Attributes:
        layout: Where this process sits (stage, replica, neighbours).
        inputs: The tensors this stage receives from the previous one (the cut before it;
            ``()`` for stage 0, which reads the model's inputs).
        outputs: The tensors it sends to the next one (``()`` for the last stage).
        micro_batches: M.
        schedule: A name of `tfdist.pipeline.schedule.SCHEDULES` (one chunk per process).
        timeout: Seconds each transfer may wait for its peer (0: no limit).
        connect: Makes the link ``connect(pair, timeout)`` to a neighbour from the pair's
            group (`PipelineLayout.pair`): `Link` (collectives between processes), or an
            in-process mailbox's (`tfdist.pipeline.local`).
        recompute: Keep only each micro-batch's stage input between its forward and its
            backward, which runs the stage again under a tape (GPipe's re-materialisation):
            less activation memory for one more forward per micro-batch.
        chunk_engines: A process holding v > 1 chunks: chunk ``c``'s engine (piece ``c K + k``);
            this engine (no cut of its own) runs them. Empty: the engine is its one stage's.
        keyed_by_edge: A chunk's engine: two processes share several edges, so each edge's
            transfers are numbered apart (`tfdist.pipeline.interleave.ChunkLink`).
        whole_batch_weights: Compute the weight gradients once per step over the replica
            batch instead of summing them over micro-batches (`tfdist.pipeline.batch_weights`):
            no sums held through the step, for one more forward of the stage.
    """

    layout: PipelineLayout
    inputs: tuple[BoundaryTensor, ...]
    outputs: tuple[BoundaryTensor, ...]
    micro_batches: int
    schedule: str = "gpipe"
    timeout: float = 0.0
    connect: Callable[[ProcessGroup, float], Any] = Link
    recompute: bool = False
    chunk_engines: tuple[StageEngine, ...] = ()
    keyed_by_edge: bool = False
    whole_batch_weights: bool = False

    # ----------------------------------------------------------------- links
    def _link(self, peer: int | None, piece: int) -> Link | ChunkLink | None:
        """The link to ``peer`` across the cut after ``piece`` (None: no neighbour there)."""
        if peer is None:
            return None
        link = self.connect(self.layout.pair(peer), self.timeout)
        return ChunkLink(link, piece * self.micro_batches) if self.keyed_by_edge else link

    @property
    def previous(self) -> Link | ChunkLink | None:
        return self._link(self.layout.previous, self.layout.stage - 1)

    @property
    def next(self) -> Link | ChunkLink | None:
        return self._link(self.layout.next, self.layout.stage)

    @property
    def plan(self) -> schedules.PipelineSchedule:
        """The schedule of this pipeline (v = the chunks this process holds)."""
        return schedules.schedule_class(self.schedule)(
            self.layout.stages, self.micro_batches, len(self.chunk_engines) or 1)

    def ops(self) -> tuple[schedules.Action, ...]:
        """This process's actions ``(op, micro_batch, chunk)`` of one training step."""
        return self.plan.actions(self.layout.stage)

    # ----------------------------------------------------------------- data
    def replica_rows(self, tensor: Any) -> Any:
        """This replica's rows of a global batch (one tensor or a structure of them, such as a
        KerasHub model's dict of inputs): the d-th of D equal slices."""
        replicas = self.layout.replicas
        if replicas == 1 or tensor is None:
            return tensor
        return tf.nest.map_structure(
            lambda t: tf.split(t, replicas, axis=0)[self.layout.replica], tensor)

    def _split(self, tensor: Any) -> list[Any]:
        return tf.split(tensor, self.micro_batches, axis=0)

    def _split_inputs(self, x: Any) -> list[list[Any]]:
        """Each micro-batch's model inputs (``x``: one tensor, or a structure of them)."""
        parts = [self._split(t) for t in tf.nest.flatten(x)]
        return [list(inputs) for inputs in zip(*parts, strict=True)]

    def _micro_rows(self, batch_rows: Any) -> Any:
        return batch_rows // self.micro_batches

    # ----------------------------------------------------------------- steps
    def train(
        self,
        call: Any,
        variables: Any,
        x: Any,
        y: Any,
        loss_fn: LossFn,
        sample_weight: Any = None,
        terms: Any = None,
    ) -> tuple[Any, list[Any], list[Any]]:
        """Builds one pipelined step of this process's stage or chunks (in a ``tf.function``).

        Args:
            call: Runs this stage on a micro-batch (``lambda a: model(a, training=True)``);
                with ``chunk_engines``, a list of one per chunk (so are ``variables`` and
                ``terms``).
            variables: The stage's trainable variables, in the order of the returned gradients.
            x: This replica's input rows (used by stage 0; its row count by every stage).
            y: This replica's targets (used by the last stage).
            loss_fn: ``loss_fn(y, y_pred, sample_weight)`` -> the mean loss of a micro-batch
                (last stage).
            sample_weight: This replica's sample weights, or None (used by the last stage).
            terms: This stage's regularization losses, or None.

        Returns:
            ``(loss, gradients, outputs)``: on the last stage the replica's mean loss (with
            every stage's terms) and its
            outputs per micro-batch; elsewhere ``loss`` is None and ``outputs`` empty. The
            gradients (every chunk's, in chunk order) are summed over micro-batches, not yet
            averaged over replicas. Every send of the step is a control input of ``loss``
            and of each gradient.
        """
        engines, calls, variables, terms = self._per_chunk(call, variables, terms)
        steps = [engine.begin(calls[c], variables[c], x, y, loss_fn, sample_weight, terms[c])
                 for c, engine in enumerate(engines)]
        run_actions(engines, steps, self.ops())
        results = [engine.finish(step) for engine, step in zip(engines, steps, strict=True)]
        loss, _, outputs = results[-1]
        return loss, [g for _, grads, _ in results for g in grads], outputs

    def _per_chunk(self, calls: Any, variables: Any = None, terms: Any = None
                   ) -> tuple[Sequence[StageEngine], list[Any], list[Any], list[Any]]:
        """The engines that run this process's chunks, and their calls, variables and terms."""
        if not self.chunk_engines:
            return (self,), [calls], [variables], [terms]
        return (self.chunk_engines, list(calls), list(variables or []),
                list(terms or [None] * len(self.chunk_engines)))

    def begin(self, call: Callable[[Any], Any], variables: Sequence[Any], x: Any, y: Any,
              loss_fn: LossFn, sample_weight: Any = None,
              terms: LossTerms | None = None) -> StageStep:
        """The empty state of one step of this stage (see `train`'s arguments)."""
        layout = self.layout
        last = layout.is_last
        return StageStep(
            call=call, variables=list(variables), loss_fn=loss_fn,
            rows=self._micro_rows(tf.shape(tf.nest.flatten(x)[0])[0]),
            xs=self._split_inputs(x) if layout.is_first else None,
            ys=self._split(y) if last else None,
            weights=self._split(sample_weight) if last and sample_weight is not None else None,
            grads=[None] * len(variables), terms=terms)

    def run_op(self, step: StageStep, op: str, m: int) -> None:
        """Builds one ``(op, micro_batch)`` of the schedule, after the stage's previous op
        (the op's handler: `OP_HANDLERS`)."""
        handler = OP_HANDLERS[op]
        if self.whole_batch_weights and op == schedules.BACKWARD:
            handler = batch_weights.backward_op
        with tf.control_dependencies(step.chain):
            marker = handler(self, step, m)
        step.chain = tf.nest.flatten(marker)

    def finish(self, step: StageStep) -> tuple[Any, list[Any], list[Any]]:
        """``train``'s result from a step whose schedule has been built."""
        layout, micro = self.layout, self.micro_batches
        if self.whole_batch_weights:
            batch_weights.weight_gradients(self, step)
        own = self._weight_terms(step)
        if not layout.is_last:
            own += list(step.added.values())
        carried = self.carry(own, step.sends, TRAIN)
        grads = [tf.zeros_like(v) if g is None else g
                 for g, v in zip(step.grads, step.variables, strict=True)]
        with tf.control_dependencies(step.sends + step.chain):
            grads = [tf.identity(g) for g in grads]
            loss = None
            if layout.is_last:
                loss = tf.add_n([step.losses[m] for m in range(micro)])
                loss = tf.identity(loss + tf.cast(carried, loss.dtype))
        ordered = [step.outputs[m] for m in range(micro)] if layout.is_last else []
        return loss, grads, ordered

    def _weight_terms(self, step: StageStep) -> list[Any]:
        """Adds the gradients of the stage's weight regularization (once per step) into the
        step's sums; returns its value (``[]`` if none)."""
        if step.terms is None:
            return []
        with tf.GradientTape() as tape:
            value = step.terms.weights()
        if value is None:
            return []
        gradients.accumulate(step.grads, tape.gradient(value, step.variables))
        return [value]

    def _added(self, terms: LossTerms | None) -> Any | None:
        """The losses the call just made added, divided by M (each is a mean over its rows)."""
        value = None if terms is None else terms.added()
        return None if value is None else value / self.micro_batches

    def carry(self, own: Sequence[Any], sends: list[Any], phase: int) -> Any | None:
        """The sum of stages ``0..k``'s loss terms: ``own`` (this stage's) plus what the previous
        stage sends; sent on to the next stage (the send joins ``sends``). Returns the whole
        pipeline's sum on the last stage, None elsewhere. Every stage takes part, with zero if
        it has no terms: a stage cannot know whether the others have some."""
        total = tf.add_n([tf.cast(t, tf.float32) for t in own]) if own else tf.zeros([])
        if not self.layout.is_first:
            total += self.previous.recv(  # type: ignore[union-attr]
                [], tf.float32, ACTIVATION, 0, index=TERMS_INDEX, phase=phase)
        if self.layout.is_last:
            return total
        sends.append(self.next.send(  # type: ignore[union-attr]
            total, ACTIVATION, 0, index=TERMS_INDEX, phase=phase))
        return None

    def _input(self, m: int, rows: Any, xs: list[Any] | None, phase: int) -> list[Any]:
        """Micro-batch ``m``'s inputs: stage 0's slice of the data, else the tensors the previous
        stage sends across the cut."""
        if self.layout.is_first:
            return xs[m]  # type: ignore[index]
        return recv_boundary(self.previous, self.inputs, rows, ACTIVATION, m, phase)

    def _run(self, step: StageStep, m: int, inp: Any) -> Any:
        """Runs the stage on micro-batch ``m``'s input (and, on the last stage, its loss)."""
        out = step.call(inp)
        added = self._added(step.terms)
        if added is not None:
            step.added[m] = added
        if self.layout.is_last:
            weight = None if step.weights is None else step.weights[m]
            step.losses[m] = step.loss_fn(step.ys[m], out, weight) / self.micro_batches
            if added is not None:
                step.losses[m] += tf.cast(added, step.losses[m].dtype)
        return out

    def differentiable(self, inputs: Sequence[Any]) -> list[Any]:
        """The received tensors whose gradients go back (`BoundaryTensor.gradient`)."""
        return [t for t, b in zip(inputs, self.inputs, strict=True) if b.gradient]

    def _taped(self, step: StageStep, m: int, inp: Any) -> tuple[Any, Any]:
        """`_run` under a tape that watches the differentiable inputs (unless stage 0):
        ``(tape, output)``."""
        tape = tf.GradientTape(persistent=False)
        with tape:
            if not self.layout.is_first:
                tape.watch(self.differentiable(inp))
            out = self._run(step, m, inp)
        return tape, out

    def _forward_op(self, step: StageStep, m: int) -> Any:
        layout = self.layout
        inp = self._input(m, step.rows, step.xs, TRAIN)
        step.inputs[m] = inp
        if self.recompute:  # keep the input only; the backward runs the stage again
            out = self._run(step, m, inp)
            if layout.is_last:
                step.outputs[m] = out
        else:
            step.tapes[m], out = self._taped(step, m, inp)
            step.outputs[m] = out
        if layout.is_last:
            return step.losses[m]
        out = tf.nest.flatten(out)
        if not self.recompute:
            step.outputs[m] = out
        step.sends.extend(send_boundary(self.next, out, self.outputs, ACTIVATION, m))
        return out

    def backward_heads(self, step: StageStep, m: int) -> tuple[Any, list[Any], Any]:
        """Micro-batch ``m``'s tape and what its backward differentiates: ``(tape, targets,
        heads)`` (the last stage: its loss, heads None; else its outputs and the losses its call
        added, their gradients received from the next stage, or ones)."""
        layout = self.layout
        if self.recompute:
            tape, output = self._taped(step, m, step.inputs[m])
            output = output if layout.is_last else tf.nest.flatten(output)
        else:
            tape, output = step.tapes.pop(m), step.outputs[m]
        if layout.is_last:
            return tape, step.losses[m], None
        upstream = recv_boundary(self.next, self.outputs, step.rows, GRADIENT, m, like=output)
        pairs = [(t, g) for t, g in zip(output, upstream, strict=True) if g is not None]
        targets, heads = [t for t, _ in pairs], [g for _, g in pairs]
        if m in step.added:
            targets.append(step.added[m])
            heads.append(tf.ones_like(step.added[m]))
        return tape, targets, heads

    def send_input_gradients(self, step: StageStep, m: int, inputs: Sequence[Any],
                             result: Sequence[Any]) -> Any:
        """Sends the gradients ``result`` of the differentiable ``inputs`` to the previous stage
        (zeros where None); returns their group (the op's marker)."""
        back = iter(tf.zeros_like(t) if g is None else g
                    for t, g in zip(inputs, result, strict=True))
        backs = [next(back) if b.gradient else None for b in self.inputs]
        step.sends.extend(send_boundary(self.previous, backs, self.inputs, GRADIENT, m))
        return tf.group([g for g in backs if g is not None])

    def _backward_op(self, step: StageStep, m: int) -> Any:
        layout, variables, grads = self.layout, step.variables, step.grads
        inputs = [] if layout.is_first else self.differentiable(step.inputs[m])
        tape, targets, heads = self.backward_heads(step, m)
        result = tape.gradient(targets, [*variables, *inputs], output_gradients=heads)
        gradients.accumulate(grads, result[:len(variables)])
        done = [g for g in grads if g is not None]
        if layout.is_first:
            return tf.group(done) if done else tf.no_op()
        sent = self.send_input_gradients(step, m, inputs, result[len(variables):])
        # The stage's next op also waits for this micro-batch's weight gradients to be summed:
        # ordered after the send alone, the next backward could run beside the sum, two
        # micro-batches' weight gradients alive at once (a loaded machine's last stage peaked
        # 201 MB above its start against 170 alone, one process's whole model 200).
        return tf.group([*tf.nest.flatten(sent), *done])

    def forward(self, call: Any, x: Any, phase: int = EVALUATE,
                terms: Any = None) -> tuple[list[Any], Any | None]:
        """Builds a forward-only pass (evaluate, predict); the last stage gets the outputs.

        With ``terms`` (evaluate), the stages' loss terms are carried to the last stage, which
        adds them to the loss as Keras's ``evaluate`` does. With ``chunk_engines``, ``call``
        and ``terms`` are lists of one per chunk, run in chunk order.

        Returns:
            ``(outputs, terms)``: the outputs per micro-batch and the sum of every stage's
            terms (None without ``terms``) on the last stage; elsewhere ``[marker]``, a
            `tf.no_op` with every send as a control input, and None.
        """
        if not self.chunk_engines:
            return self._forward_stage(call, x, phase, terms)
        engines, calls, _, terms = self._per_chunk(call, None, terms)
        results = [engine._forward_stage(calls[c], x, phase, terms[c])  # noqa: SLF001
                   for c, engine in enumerate(engines)]
        markers = [t for result in results[:-1] for t in tf.nest.flatten(result[0])]
        outs, carried = results[-1]
        if not self.layout.is_last:
            return [tf.group([*markers, *outs])], None
        with tf.control_dependencies(markers):
            return tf.nest.map_structure(tf.identity, outs), carried

    def _forward_stage(self, call: Callable[[Any], Any], x: Any, phase: int,
                       terms: LossTerms | None) -> tuple[list[Any], Any | None]:
        """`forward` of this engine's one stage."""
        layout = self.layout
        rows = self._micro_rows(tf.shape(tf.nest.flatten(x)[0])[0])
        xs = self._split_inputs(x) if layout.is_first else None
        chain: list[Any] = []
        sends: list[Any] = []
        outs, added = [], []
        for m in range(self.micro_batches):
            with tf.control_dependencies(chain):
                out = call(self._input(m, rows, xs, phase))
                added.append(self._added(terms))
                if layout.is_last:
                    outs.append(out)
                else:
                    out = tf.nest.flatten(out)
                    sends.extend(send_boundary(self.next, out, self.outputs, ACTIVATION, m,
                                               phase))
            chain = tf.nest.flatten(out)
        carried = None
        if terms is not None:
            weights = terms.weights()
            own = [t for t in [weights, *added] if t is not None]
            carried = self.carry(own, sends, phase)
        if layout.is_last:
            return outs, carried
        with tf.control_dependencies(sends + chain):
            return [tf.no_op()], None

    # ----------------------------------------------------------------- replicas
    def average_over_replicas(self, tensors: Sequence[Any], kind: int = REDUCE,
                              phase: int = TRAIN) -> list[Any]:
        """The mean of each tensor over this stage's D replicas (identity when D = 1); an
        ``IndexedSlices`` stays one, with every replica's rows (`gradients.average_over_group`)."""
        return gradients.average_over_group(tensors, self.layout.group(DATA), kind, phase,
                                            self.timeout)

    def share(self, values: Any | None, shape: Any, dtype: Any, index: int = 0,
              phase: int = TRAIN, sized: bool = False) -> Any:
        """The last stage's ``values`` on every stage of this replica (a broadcast in K).

        Args:
            values: The tensor on the last stage (ignored elsewhere).
            shape: Its shape (used by the receivers; may be a tensor).
            dtype: Its dtype.
            index: Distinguishes several shares in one step.
            sized: Its shape changes from batch to batch (a sequence length): it travels on
                a sized key (`tfdist.parallel.ops.sized_broadcast`).
        """
        group = self.layout.group(PIPE)
        if group.size == 1:
            return values
        if sized:
            last = self.layout.is_last
            moved = sized_broadcast(values if last else None, shape, dtype, group=group,
                                    instance=sized_key(SHARE, 0, index, phase),
                                    timeout=self.timeout)
            if not last:
                return moved
            with tf.control_dependencies([moved]):  # the send, else pruned
                return tf.identity(values)
        return transport.group_broadcast(
            values if self.layout.is_last else None, shape, dtype, group=group,
            instance=instance_key(SHARE, 0, index, phase), timeout=self.timeout)


OP_HANDLERS: dict[str, Callable[[StageEngine, StageStep, int], Any]] = {
    schedules.FORWARD: StageEngine._forward_op,  # noqa: SLF001
    schedules.BACKWARD: StageEngine._backward_op,  # noqa: SLF001
    schedules.BACKWARD_INPUT: input_gradient_op,
    schedules.BACKWARD_WEIGHT: weight_gradient_op,
}
"""What builds each op kind of a schedule's actions (`StageEngine.run_op`): a schedule with a
new kind of op adds its handler here."""
