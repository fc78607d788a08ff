"""Pipeline schedules as classes in one registry: ZB-H1's actions and bubble, the closed forms of
the others against the one simulator, and a schedule added in one class and one registry line
seen by every reader (the launcher's choices, the config, the engine, the simulator, the
benchmark's bound and the advisor)."""

from __future__ import annotations

import pytest

from tfdist.advise import model as cost_model
from tfdist.advise.candidates import Candidate, Cluster
from tfdist.advise.predict import predict
from tfdist.advise.profile import Line, ModelProfile
from tfdist.bench.pipeline import pipeline_row
from tfdist.errors import StrategyConfigError
from tfdist.launcher.arguments import build_parser
from tfdist.pipeline import schedule
from tfdist.pipeline.config import PipelineConfig
from tfdist.pipeline.schedule import Action, OneFOneB, ZeroBubbleH1

pytestmark = pytest.mark.unit

SIZES = [(1, 1), (2, 1), (2, 4), (2, 8), (3, 2), (3, 6), (4, 8), (4, 16)]


def test_zero_bubble_splits_every_backward_and_defers_stage_k_s_first_k_weight_passes():
    assert ["".join(map(str, a[:2])) for a in ZeroBubbleH1(2, 4).actions(0)] == [
        "F0", "F1", "I0", "W0", "F2", "I1", "W1", "F3", "I2", "W2", "I3", "W3"]
    assert ["".join(map(str, a[:2])) for a in ZeroBubbleH1(2, 4).actions(1)] == [
        "F0", "I0", "F1", "I1", "W0", "F2", "I2", "W1", "F3", "I3", "W2", "W3"]
    # Without its W the order of F and I is 1F1B's, the I in the place of its B.
    for k in range(4):
        forward_and_input = [a for a in ZeroBubbleH1(4, 8).actions(k) if a.op != "W"]
        assert forward_and_input == [a._replace(op="I") if a.op == "B" else a
                                     for a in OneFOneB(4, 8).actions(k)]


@pytest.mark.parametrize("stages, micro_batches", SIZES)
def test_zero_bubble_runs_each_op_once_in_order_without_deadlock(stages, micro_batches):
    plan = ZeroBubbleH1(stages, micro_batches)
    for k, ops in enumerate(plan.all_actions()):
        expected = {Action(op, m) for op in "FIW" for m in range(micro_batches)}
        assert sorted(ops) == sorted(expected) and len(ops) == len(expected)
        for m in range(micro_batches):
            assert ops.index(Action("F", m)) < ops.index(Action("I", m)) < ops.index(
                Action("W", m))
        # every stage holds at most 1F1B's most (its stage 0's: K, or M if fewer)
        most = OneFOneB(stages, micro_batches).in_flight()
        assert plan.in_flight(k) <= most == min(stages, micro_batches)
    assert len(schedule.simulate(plan.all_actions())) == 3 * stages * micro_batches


@pytest.mark.parametrize("stages, micro_batches", SIZES)
def test_zero_bubble_cuts_1f1b_s_bubble_to_a_third_when_f_i_w_take_as_long(stages, micro_batches):
    zero, one = ZeroBubbleH1(stages, micro_batches), OneFOneB(stages, micro_batches)
    assert one.idle_slots() == pytest.approx(stages - 1)
    if micro_batches >= stages:  # a full steady state
        assert zero.idle_slots() == pytest.approx((stages - 1) / 3)
    assert zero.step_time() <= one.step_time()
    if stages > 1:
        assert zero.bubble() < one.bubble()
    # All of the backward in W: I is free, nothing to move into the bubble beyond what I frees.
    assert zero.step_time(weight=0.0) <= one.step_time()


def test_simulated_step_k2_m4_numbers():
    assert ZeroBubbleH1(2, 4).step_time() == 13.0 and OneFOneB(2, 4).step_time() == 15.0
    assert ZeroBubbleH1(4, 8).step_time() == 27.0 and OneFOneB(4, 8).step_time() == 33.0
    assert ZeroBubbleH1(2, 4).bubble() == pytest.approx(1 / 13)


@pytest.mark.parametrize("stages, micro_batches", SIZES)
def test_closed_forms_match_the_simulated_bubble(stages, micro_batches):
    for name in ("gpipe", "1f1b"):
        plan = schedule.schedule_class(name)(stages, micro_batches)
        assert plan.bubble() == pytest.approx(schedule.bubble_fraction(stages, micro_batches))
    if stages > 1 and micro_batches % stages == 0:
        plan = schedule.Interleaved(stages, micro_batches, 2)
        assert plan.bubble() == pytest.approx(
            schedule.interleaved_bubble_fraction(stages, micro_batches, 2))


def test_a_schedule_of_the_wrong_shape_is_refused_with_the_fix():
    with pytest.raises(StrategyConfigError, match="Model chunks per process are for the "
                       "interleaved schedule. Received: chunks=2, schedule='zb-h1'"):
        PipelineConfig(stages=2, micro_batches=4, schedule="zb-h1", chunks=2)
    with pytest.raises(StrategyConfigError, match="stage is out of range"):
        ZeroBubbleH1(2, 4).actions(2)
    with pytest.raises(StrategyConfigError, match="PipelineSchedule subclass"):
        schedule.register_schedule(type("Nameless", (schedule.GPipe,), {"name": ""}))


class OneAtATime(schedule.PipelineSchedule):
    """A toy: each micro-batch's forward and backward before the next one's (no overlap)."""

    name = "one-at-a-time"
    summary = "no overlap (a test's toy)"

    def actions(self, stage: int) -> tuple[Action, ...]:
        self._rank(stage)
        return tuple(Action(op, m) for m in range(self.micro_batches) for op in "FB")


@pytest.fixture
def toy(monkeypatch):
    """`OneAtATime` in the registry for one test: the one line a new schedule adds."""
    monkeypatch.setitem(schedule.SCHEDULES, OneAtATime.name, OneAtATime)
    return OneAtATime


def _profile():
    return ModelProfile(
        names=("a", "b"), params=(1, 1), param_bytes=(2000, 2000), activation_bytes=(400, 40),
        forward=(Line(0, 1e-5), Line(0, 1e-5)), backward=(Line(0, 2e-5), Line(0, 2e-5)),
        step=Line(0.0, 6e-5), optimizer_slots=0, embeddings=(), threads=1, batch=64)


def test_a_schedule_added_in_one_class_and_one_registry_line_reaches_every_reader(toy):
    # the launcher's --schedule choices and help
    parser = build_parser()
    args = parser.parse_args(["--workers", "2", "--stages", "2", "--schedule", toy.name, "t.py"])
    assert args.schedule == toy.name and toy.summary in parser.format_help().replace("\n", " ")
    # the config (and what the launcher writes into the tasks' environment)
    config = PipelineConfig(stages=2, micro_batches=4, schedule=toy.name)
    assert PipelineConfig.from_env(config.env()).schedule_class is toy
    # the engine's actions of a stage
    from tfdist.pipeline.engine import StageEngine
    from tfdist.pipeline.layout import PipelineLayout

    engine = StageEngine(PipelineLayout(2, 2, 1), (), (), micro_batches=4, schedule=toy.name)
    assert [a.op for a in engine.ops()] == ["F", "B"] * 4
    # the simulator: K = 2 stages one after the other, M (K - 1) idle slots
    plan = toy(2, 4)
    assert plan.step_time() == 2 * 4 * 3.0 and plan.idle_slots() == 4.0
    assert cost_model.bubble(2, 4, toy.name) == 0.5
    # the benchmark's bound and bubble
    report = {"stage_s": 0.1, "loop_step_s": 0.9, "over_bound": 1.1, "step_s": 1.0,
              "fit_call_s": 0.1}
    rows = [pipeline_row(2, 4, name, 1, {"worker:0": report}, 1.0) for name in ("1f1b", toy.name)]
    assert rows[1]["ideal_s"] == pytest.approx(0.8) and rows[0]["ideal_s"] == pytest.approx(0.5)
    assert rows[1]["mode"] == f"pipeline {toy.name}" and rows[1]["bubble"] == 0.5
    # the advisor: the toy's idle slots in the bubble term, its flag on the command line
    candidate = Candidate("pipeline", 2, stages=2, micro_batches=4, schedule=toy.name)
    assert candidate.launch_argv()[-3:] == ["--schedule", toy.name, "train.py"]
    link, cluster = cost_model.Link(alpha=0.0, beta=0.0), Cluster(2, cores=2)
    toy_terms = predict(candidate, _profile(), {"tf": link}, cluster, 64).terms
    plain = predict(Candidate("pipeline", 2, stages=2, micro_batches=4), _profile(),
                    {"tf": link}, cluster, 64).terms
    assert toy_terms[1].kind == plain[1].kind == "bubble"
    assert toy_terms[1].seconds == pytest.approx(4 * plain[1].seconds)  # 4 slots against 1
    assert toy.name in toy_terms[1].detail


def test_the_registry_names_every_built_in_schedule():
    assert list(schedule.SCHEDULES) == ["gpipe", "1f1b", "interleaved", "zb-h1"]
    assert [c.split_backward for c in schedule.SCHEDULES.values()] == [False, False, False, True]
    assert [c.multi_chunk for c in schedule.SCHEDULES.values()] == [False, False, True, False]


def test_w_holds_back_exactly_the_ops_only_the_weight_gradients_need():
    import types

    import tensorflow as tf

    from tfdist.pipeline import split_backward
    from tfdist.pipeline.engine import StageStep

    kernel = tf.Variable([[2.0, 1.0], [0.5, 3.0]])
    seen: dict = {}

    class Engine:  # what the handlers ask of a middle stage's engine
        layout = types.SimpleNamespace(is_first=False)

        def backward_heads(self, step, m):
            return step.tapes.pop(m), [step.outputs[m]], [tf.ones_like(step.outputs[m])]

        def differentiable(self, inputs):
            return inputs

        def send_input_gradients(self, step, m, inputs, result):
            seen["dx"] = result
            return tf.group(result)

    @tf.function
    def build(x):
        step = StageStep(None, [kernel], None, None, None, None, None, [None])
        with tf.GradientTape() as tape:
            tape.watch(x)
            step.outputs[0] = tf.tanh(tf.matmul(tf.tanh(tf.matmul(x, kernel)), kernel))
        step.tapes[0], step.inputs[0] = tape, [x]
        split_backward.input_gradient_op(Engine(), step, 0)
        seen["held"] = list(step.deferred[0][1])
        step.chain = [tf.identity(x, name="op_before_w")]
        split_backward.weight_gradient_op(Engine(), step, 0)
        return step.grads[0]

    graph = build.get_concrete_function(tf.TensorSpec([3, 2])).graph
    held = seen["held"]
    before = graph.get_operation_by_name("op_before_w")
    assert any(op.type == "MatMul" for op in held)  # x^T g: the weight gradients' products
    assert all(before in op.control_inputs for op in held)
    shared = split_backward.weight_only_ops(graph.get_operations(), [], seen["dx"])
    assert shared and not set(shared) & set(held)  # the input gradient's ops run in I
    assert not any(before in op.control_inputs for op in shared)
    x = tf.constant([[0.1, 0.2], [0.3, -0.4], [0.5, 0.6]])
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(tf.tanh(tf.matmul(tf.tanh(tf.matmul(x, kernel)), kernel)))
    assert float(tf.reduce_max(tf.abs(build(x) - tape.gradient(total, kernel)))) < 1e-6
