"""The mixin: where a process sits, step-size math, dataset sharding, save-once paths."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import tensorflow as tf

import tfdist.strategies
from tfdist.cluster import ClusterSpec, Task
from tfdist.errors import StrategyConfigError
from tfdist.strategies.base import SINGLE_HOST_CLUSTER, TfdistStrategyMixin
from tfdist.strategies.input import shard_for

pytestmark = pytest.mark.unit

SPEC = ClusterSpec(chief=["h:1"], worker=["h:2", "h:3"])


class FakeStrategy(TfdistStrategyMixin):
    """The mixin without TensorFlow: 4 replicas, placed by the test."""

    name = "fake"
    num_replicas_in_sync = 4

    def __init__(self, task: Task, every_worker_saves: bool) -> None:
        self.every_worker_saves = every_worker_saves  # type: ignore[misc]
        self._init_tfdist(SPEC, task)


class FakeModel:
    def __init__(self) -> None:
        self.saved_to: list[str] = []

    def save(self, path: str) -> None:
        Path(path).write_text("weights")
        self.saved_to.append(path)


@pytest.mark.parametrize(
    ("task", "is_chief", "worker_index"),
    [(Task("chief", 0), True, 0), (Task("worker", 0), False, 1), (Task("worker", 1), False, 2)],
)
def test_placement(task, is_chief, worker_index):
    strategy = FakeStrategy(task, every_worker_saves=True)
    assert (strategy.is_chief, strategy.worker_index, strategy.num_workers) == (
        is_chief, worker_index, 3)
    assert (strategy.task_type, strategy.task_index) == (task.type, task.index)
    ctx = strategy.input_context()
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == (
        3, worker_index, 4)


def test_worker_zero_is_chief_without_a_chief_task():
    strategy = FakeStrategy(Task("worker", 0), every_worker_saves=True)
    strategy._tfdist_cluster = ClusterSpec(worker=["h:2", "h:3"])
    assert strategy.is_chief and strategy.worker_index == 0 and strategy.num_workers == 2


def test_batch_and_learning_rate_scale_with_replicas():
    strategy = FakeStrategy(Task("chief", 0), every_worker_saves=True)
    assert strategy.global_batch_size(32) == 128
    assert strategy.scale_learning_rate(0.01) == pytest.approx(0.04, rel=1e-12)


@pytest.mark.parametrize("bad", [0, -2, 2.5, True, "8"])
def test_bad_batch_size(bad):
    strategy = FakeStrategy(Task("chief", 0), every_worker_saves=True)
    with pytest.raises(StrategyConfigError, match=r"per_replica must be a positive int\. Rec"):
        strategy.global_batch_size(bad)


@pytest.mark.parametrize("bad", [0, -0.1, "0.1", None])
def test_bad_learning_rate(bad):
    strategy = FakeStrategy(Task("chief", 0), every_worker_saves=True)
    with pytest.raises(StrategyConfigError, match=r"lr must be a positive number\. Received: "):
        strategy.scale_learning_rate(bad)


def test_chief_saves_to_the_real_path(tmp_path):
    strategy = FakeStrategy(Task("chief", 0), every_worker_saves=True)
    model = FakeModel()
    target = tmp_path / "out" / "model.keras"
    assert strategy.save_model(model, target) == str(target)
    assert model.saved_to == [str(target)] and target.read_text() == "weights"


def test_collective_save_goes_to_a_deleted_temp_dir_on_other_workers(tmp_path):
    strategy = FakeStrategy(Task("worker", 1), every_worker_saves=True)
    model = FakeModel()
    target = tmp_path / "model.keras"
    assert strategy.save_model(model, target) is None
    assert model.saved_to == [str(tmp_path / ".tfdist-tmp-worker-1" / "model.keras")]
    assert os.listdir(tmp_path) == []  # the temporary copy is gone, the real path untouched


def test_chief_only_save_is_skipped_on_other_workers(tmp_path):
    strategy = FakeStrategy(Task("worker", 0), every_worker_saves=False)
    model = FakeModel()
    assert strategy.write_path(tmp_path / "m.keras") is None
    assert strategy.save_model(model, tmp_path / "m.keras") is None
    assert model.saved_to == [] and os.listdir(tmp_path) == []


def test_checkpoints_of_other_workers_are_deleted(tmp_path):
    chief = FakeStrategy(Task("chief", 0), every_worker_saves=True)
    worker = FakeStrategy(Task("worker", 0), every_worker_saves=True)
    # Each process has its own Checkpoint object (its save counter counts its own saves).
    mine = tf.train.Checkpoint(step=tf.Variable(5))
    assert worker.save_checkpoint(mine, tmp_path / "ckpt") is None
    assert os.listdir(tmp_path) == []
    prefix = chief.save_checkpoint(tf.train.Checkpoint(step=tf.Variable(7)), tmp_path / "ckpt")
    assert prefix == str(tmp_path / "ckpt" / "ckpt-1")
    restored = tf.train.Checkpoint(step=tf.Variable(0))
    assert worker.restore_checkpoint(restored, tmp_path / "ckpt") == prefix
    assert int(restored.step.numpy()) == 7


def test_shard_for_deals_whole_batches():
    ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1)
    batches = shard_for(tf.data.Dataset.range(12).batch(2), ctx)
    assert [b.numpy().tolist() for b in batches] == [[2, 3], [6, 7], [10, 11]]


def test_single_host_strategy_surface():
    strategy = tfdist.strategies.get_strategy("default")
    assert strategy.cluster is SINGLE_HOST_CLUSTER
    assert (strategy.task_type, strategy.task_index, strategy.is_chief) == ("worker", 0, True)
    assert (strategy.num_workers, strategy.num_replicas) == (1, 1)
    assert strategy.callbacks() == []
    assert strategy.describe() == "default: single host, 1 worker(s), 1 replica(s) in sync, chief"


def test_distribute_dataset_feeds_model_fit_on_default():
    strategy = tfdist.strategies.get_strategy("default")

    def dataset_fn(ctx):
        x = tf.reshape(tf.range(8, dtype=tf.float32), (8, 1))
        return tf.data.Dataset.from_tensor_slices((x, 2 * x)).batch(
            ctx.get_per_replica_batch_size(4))

    dist = strategy.distribute_dataset(dataset_fn)
    assert [b[0].numpy().ravel().tolist() for b in dist] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_distribute_dataset_needs_a_function():
    strategy = tfdist.strategies.get_strategy("default")
    with pytest.raises(StrategyConfigError, match="needs a function, not a dataset"):
        strategy.distribute_dataset(tf.data.Dataset.range(3))
    with pytest.raises(StrategyConfigError, match="must return a tf.data.Dataset"):
        list(strategy.distribute_dataset(lambda ctx: [1, 2, 3]))


def test_default_strategy_fit_matches_plain_fit():
    """Keras (this process's flavour) trains from `distribute_dataset` exactly as from arrays."""
    from tfdist.core import flavour

    keras = flavour.get_keras()
    x = tf.reshape(tf.range(16, dtype=tf.float32) / 16.0, (8, 2)).numpy()
    y = (x @ [[1.0], [-1.0]]).astype("float32")

    def build():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
        return model

    strategy = tfdist.strategies.get_strategy("default")
    with strategy.scope():
        model = build()
    reference = build()
    reference.set_weights(model.get_weights())
    start = model.get_weights()[0].copy()
    dist = strategy.distribute_dataset(
        lambda ctx: tf.data.Dataset.from_tensor_slices((x, y)).batch(4))
    model.fit(dist, epochs=1, steps_per_epoch=2, verbose=0)
    reference.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert abs(model.get_weights()[0] - start).max() > 1e-2
    for got, want in zip(model.get_weights(), reference.get_weights(), strict=True):
        assert abs(got - want).max() <= 1e-6


def test_saving_on_sigterm_is_refused_where_the_strategy_cannot(tmp_path):
    strategy = tfdist.strategies.get_strategy("default")
    assert not strategy.preemption_saves
    with pytest.raises(StrategyConfigError, match=r"(?s)save_before_preemption needs a strategy "
                       r"that saves on SIGTERM.*Received: strategy 'default' with keras3.*"
                       r"Fix: leave save_before_preemption unset"):
        strategy.backup_callback(tmp_path, save_before_preemption=True)
    # Unset, it is off: a plain BackupAndRestore (resumes from its last backup).
    assert type(strategy.backup_callback(tmp_path)).__name__ == "BackupAndRestore"
    with pytest.raises(StrategyConfigError, match=r"Received: strategy 'default'.*Fix: use "
                       r"get_strategy\('multi_worker'\)"):
        strategy.preemption_handler(tf.train.Checkpoint(), tmp_path)


def test_a_backup_directory_under_a_file_is_refused_when_the_callback_is_made(tmp_path):
    strategy = tfdist.strategies.get_strategy("default")
    (tmp_path / "taken").write_text("a file")
    for directory in (tmp_path / "taken", tmp_path / "taken" / "backups"):
        with pytest.raises(StrategyConfigError, match=r"The backup directory cannot be written: "
                           r"'.*taken' is a file, not a directory\. Received: .*taken"):
            strategy.backup_callback(directory)
    assert type(strategy.backup_callback(tmp_path / "new" / "backups")).__name__ == (
        "BackupAndRestore")


def test_a_model_saved_under_a_file_is_rescued_not_lost(tmp_path):
    """save_model runs after training: a path under a file once raised there and the trained
    model was lost. It is saved to a fresh temporary directory, and the error names it."""
    keras = tfdist.core.flavour.get_keras()
    strategy = tfdist.strategies.get_strategy("default")
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    (tmp_path / "taken").write_text("a file")
    with pytest.raises(StrategyConfigError, match=r"save_model cannot write '.*taken/m\.keras': "
                       r"'.*taken' is a file, not a directory; the trained model was saved to "
                       r"(\S+) instead\.") as raised:
        strategy.save_model(model, tmp_path / "taken" / "m.keras")
    rescued = re.search(r"saved to (\S+) instead", str(raised.value)).group(1)
    restored = keras.models.load_model(rescued)
    for got, want in zip(restored.get_weights(), model.get_weights(), strict=True):
        assert (got == want).all()
    with pytest.raises(StrategyConfigError, match=r"The checkpoint file cannot be written: "
                       r"'.*taken' is a file"):
        strategy.checkpoint_callback(tmp_path / "taken" / "w.weights.h5", save_weights_only=True)
