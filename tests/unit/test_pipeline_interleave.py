"""Interleaved 1F1B in the engine (`tfdist.pipeline.interleave`): Megatron's assignment of pieces
to processes, each chunk's neighbours (wrapping from the last process to process 0), one set of
instance keys per edge, and the refusals made before training."""

from __future__ import annotations

import doctest
import json

import pytest

from tfdist.errors import StrategyConfigError
from tfdist.launcher import cli
from tfdist.pipeline import interleave, schedule
from tfdist.pipeline.config import (
    CHUNKS_ENV,
    MICRO_BATCHES_ENV,
    SCHEDULE_ENV,
    STAGES_ENV,
    PipelineConfig,
)
from tfdist.pipeline.layout import PipelineLayout
from tfdist.pipeline.modes import ChunksPerProcess, _refuse_shared_layers, choose_mode

pytestmark = pytest.mark.unit


def test_docstring_examples_run():
    result = doctest.testmod(interleave, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("stages, chunks, expected", [
    (2, 2, [(0, 2), (1, 3)]),
    (3, 2, [(0, 3), (1, 4), (2, 5)]),
    (2, 3, [(0, 2, 4), (1, 3, 5)]),
])
def test_process_k_holds_pieces_k_k_plus_K_and_so_on(stages, chunks, expected):
    held = [interleave.pieces(stages, chunks, k) for k in range(stages)]
    assert held == expected
    assert sorted(p for ps in held for p in ps) == list(range(stages * chunks))


def test_chunk_neighbours_wrap_from_the_last_process_to_process_0():
    def layout(rank, chunk):
        return interleave.ChunkLayout(PipelineLayout(3, 3, rank), chunk, 2)

    assert (layout(0, 0).is_first, layout(0, 0).previous, layout(0, 0).next) == (True, None, 1)
    assert (layout(2, 0).stage, layout(2, 0).next) == (2, 0)  # piece 2 -> piece 3 on rank 0
    assert (layout(0, 1).stage, layout(0, 1).previous) == (3, 2)
    assert (layout(2, 1).stage, layout(2, 1).is_last, layout(2, 1).next) == (5, True, None)


def test_chunk_neighbours_of_the_second_replica_stay_in_it():
    chunk = interleave.ChunkLayout(PipelineLayout(4, 2, 3), 0, 2)  # replica 1, stage 1
    assert (chunk.stage, chunk.previous, chunk.next, chunk.replica) == (1, 2, 2, 1)


class _Recorder:
    def __init__(self, pair, timeout):
        self.pair, self.calls = pair, []

    def send(self, tensor, kind, micro_batch=0, index=0, phase=0):
        self.calls.append(("send", kind, micro_batch, index))

    def recv(self, shape, dtype, kind, micro_batch=0, index=0, phase=0):
        self.calls.append(("recv", kind, micro_batch, index))


def _engine(rank, chunk, chunks=2, stages=2, micro_batches=4):
    from tfdist.pipeline.engine import StageEngine

    return StageEngine(
        layout=interleave.ChunkLayout(PipelineLayout(stages, stages, rank), chunk, chunks),
        inputs=(), outputs=(), micro_batches=micro_batches, connect=_Recorder,
        keyed_by_edge=True)


def test_each_edge_has_its_own_micro_batch_numbers_both_sides_agree():
    # K=2, v=2: ranks 0 and 1 share one pair group for the edges after pieces 0, 1 and 2.
    sent = {}
    for rank in (0, 1):
        for chunk in (0, 1):
            engine = _engine(rank, chunk)
            piece = engine.layout.stage
            if engine.next is not None:
                sent[piece] = engine.next.offset
            if engine.previous is not None:
                assert engine.previous.offset == sent.get(piece - 1, (piece - 1) * 4)
    assert sent == {0: 0, 1: 4, 2: 8}
    link = _engine(1, 0).next
    link.send(None, 1, micro_batch=3)
    assert link.link.calls == [("send", 1, 7, 0)]


def test_the_process_runs_the_interleaved_schedule_and_the_schedules_do_not_deadlock():
    config = PipelineConfig(stages=2, micro_batches=4, schedule="interleaved", chunks=2)
    mode = choose_mode(config, processes=2, rank=1)
    assert isinstance(mode, ChunksPerProcess) and mode.pieces == (1, 3)
    ops = [schedule.interleaved(2, 4, k, 2) for k in range(2)]
    assert len(schedule.simulate(ops)) == 2 * 2 * 2 * 4


@pytest.mark.parametrize("kwargs, message", [
    ({"stages": 2, "micro_batches": 4, "schedule": "interleaved", "chunks": 0},
     "chunks must be a positive int. Received: chunks=0"),
    ({"stages": 2, "micro_batches": 4, "schedule": "1f1b", "chunks": 2},
     "Model chunks per process are for the interleaved schedule. Received: chunks=2, "
     "schedule='1f1b'"),
    ({"stages": 2, "micro_batches": 3, "schedule": "interleaved", "chunks": 2},
     "in groups of K. Received: micro_batches=3, stages=2. Expected: micro_batches a multiple "
     "of 2. Fix: use micro_batches=2 or 4"),
    ({"stages": 1, "micro_batches": 4, "schedule": "interleaved", "chunks": 2},
     "needs a pipeline of several processes. Received: stages=1"),
    ({"stages": 2, "micro_batches": 4, "schedule": "interleaved", "chunks": 2,
      "devices": ["/cpu:0", "/cpu:1"]},
     "one process per stage. Received: devices=['/cpu:0', '/cpu:1']"),
])
def test_bad_interleaved_settings_are_refused_with_the_fix(kwargs, message):
    with pytest.raises(StrategyConfigError, match="Fix:") as err:
        PipelineConfig(**kwargs)
    assert message in str(err.value)


def test_more_pieces_than_layers_are_refused():
    with pytest.raises(StrategyConfigError) as err:
        schedule.check_interleaved(2, 4, 4, layers=6)
    assert ("fewer than the 2 x 4 pieces" in str(err.value)
            and "Fix: use chunks=3 or fewer" in str(err.value))


def test_every_chunk_recomputes_when_asked():
    from tfdist.core.flavour import get_keras
    from tfdist.pipeline import stage

    keras = get_keras()

    def build():
        layers = [keras.layers.Dense(4, name=f"d{i}") for i in range(4)]
        return keras.Sequential([keras.Input((3,)), *layers])

    spec, bounds = stage.split_model(build, 4, 4)
    for recompute in (False, True):
        config = PipelineConfig(stages=2, micro_batches=4, schedule="interleaved", chunks=2,
                                recompute=recompute)
        model = choose_mode(config, processes=2, rank=1).build(spec, bounds, strategy=None)
        engine = model._engine  # noqa: SLF001
        assert [e.recompute for e in engine.chunk_engines] == [recompute] * 2
        assert [e.layout.stage for e in engine.chunk_engines] == [1, 3]


def test_tensor_parallel_stages_are_refused_interleaved():
    config = PipelineConfig(stages=2, micro_batches=4, schedule="interleaved", chunks=2)
    with pytest.raises(StrategyConfigError, match="does not split stages by tensor"):
        choose_mode(config, processes=4, rank=0, tensor=2)


def test_a_layer_called_in_two_pieces_is_refused():
    from tfdist.core.flavour import get_keras
    from tfdist.pipeline import stage

    keras = get_keras()

    def build():
        x = keras.Input((4,))
        shared = keras.layers.Dense(4, name="shared")
        h = keras.layers.Dense(4, name="a")(shared(x))
        return keras.Model(x, keras.layers.Dense(1, name="out")(shared(h)))

    spec = stage.describe_model(build)
    with pytest.raises(StrategyConfigError, match="layer 'shared' in pieces 0 and"):
        _refuse_shared_layers(spec, (0, 1, 2, 3, 4)[:len(spec.nodes) + 1])


def test_chunks_reach_the_tasks_as_the_strategy_reads_them(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("")
    argv = ["--dry-run", "--stages", "2", "--micro-batches", "4", "--schedule", "interleaved",
            "--chunks", "2", "--workers", "2", str(script)]
    assert cli.main(argv) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    configs = {PipelineConfig.from_env(line["env"]) for line in lines}
    assert configs == {PipelineConfig(stages=2, micro_batches=4, schedule="interleaved",
                                      chunks=2)}
    env = {STAGES_ENV: "2", MICRO_BATCHES_ENV: "4", SCHEDULE_ENV: "interleaved",
           CHUNKS_ENV: "2"}
    assert PipelineConfig.from_env(env).env() == env
