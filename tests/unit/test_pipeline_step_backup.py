"""The pipeline's step-level backup in one process: a fit stopped after a mid-epoch save resumes
at that step and ends with the weights of an uninterrupted fit, in both Kerases' hooks; the
vote of a one-process job; the launcher's advice when a task did not save."""

from __future__ import annotations

import doctest
import importlib
import shutil
import signal

import numpy as np
import pytest

from tfdist.core import flavour
from tfdist.errors import StrategyConfigError
from tfdist.launcher.supervisor import Supervisor
from tfdist.strategies.pipeline import PipelineStrategy

pytestmark = pytest.mark.unit

keras = flavour.get_keras()
EPOCHS, STEPS, BATCH = 2, 4, 4


@pytest.mark.parametrize("name", ["tfdist.resilience.pipeline_vote",
                                  "tfdist.resilience.pipeline_backup"])
def test_docstring_examples(name):
    assert doctest.testmod(importlib.import_module(name)).failed == 0


class _Crash(Exception):
    pass


class _CrashAfter(keras.callbacks.Callback):
    def __init__(self, step):
        super().__init__()
        self.step, self.seen = step, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.step:
            raise _Crash


def _fit(directory, *callbacks, **backup_options):
    strategy = PipelineStrategy(micro_batches=2)
    keras.utils.set_random_seed(4)
    model = strategy.build_model(lambda: keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(4, activation="tanh", name="a"),
         keras.layers.Dense(1, name="b")]))
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * BATCH, 3)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    backup = strategy.backup_callback(directory, **backup_options)
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=[*callbacks, backup])
    return model, backup


def _distance(a, b):
    return max(np.abs(g - w).max() for g, w in zip(a.get_weights(), b.get_weights(), strict=True))


@pytest.fixture
def sigterm_restored():
    """A fit that raised never reached on_train_end, which gives SIGTERM its handler back."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


@pytest.mark.slow  # seconds of training, a TF process or waiting: make test, not test-fast
def test_a_fit_resumed_mid_epoch_ends_like_an_uninterrupted_one(tmp_path, monkeypatch,
                                                                sigterm_restored):
    from tfdist.resilience import pipeline_backup

    plain, _ = _fit(tmp_path / "plain")
    with pytest.raises(_Crash):  # saved at step 6 (save_freq), then lost step 7
        _fit(tmp_path / "backup", _CrashAfter(7), save_freq=3)
    assert (tmp_path / "backup" / "rank-0" / "checkpoint").exists()
    shutil.copytree(tmp_path / "backup", tmp_path / "saved")  # for the sabotage below
    resumed, backup = _fit(tmp_path / "backup")
    assert int(resumed.optimizer.iterations.numpy()) == EPOCHS * STEPS
    assert _distance(resumed, plain) <= 1e-6
    assert not (tmp_path / "backup" / "rank-0").exists(), "a finished fit left its backup"
    assert backup.backup_dir == str(tmp_path / "backup" / "rank-0")

    # Sabotage: the first calls of the resumed epoch run on the batches they should skip.
    monkeypatch.setattr(pipeline_backup, "_reading_only", lambda run, skip: run)
    assert _distance(_fit(tmp_path / "saved")[0], plain) > 1e-4


@pytest.mark.parametrize("save_freq", [0, "batch", True])
def test_a_save_frequency_other_than_epoch_or_steps_is_refused(tmp_path, save_freq):
    with pytest.raises(StrategyConfigError, match=r"every epoch, or every N steps.*Received: "
                       r"save_freq="):
        PipelineStrategy().backup_callback(tmp_path, save_freq=save_freq)


def test_the_advice_for_an_unsaved_task_names_no_tf_keras_callback():
    pipeline = Supervisor(timeout=1, strategy="pipeline", saves_on_sigterm=True)._unsaved_fix()
    assert "strategy.backup_callback(dir)" in pipeline and "tf-keras" not in pipeline
    ps = Supervisor(timeout=1, strategy="parameter_server", saves_on_sigterm=False)._unsaved_fix()
    assert ps.startswith("The parameter_server strategy does not save at the step on SIGTERM")
