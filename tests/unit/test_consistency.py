"""The consistency checks' pure parts (`tfdist.parallel.consistency`): what counts as the same
batch or the same weights, the check's interval, and a group of one checking nothing."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfdist.errors import StrategyConfigError
from tfdist.parallel import consistency
from tfdist.parallel.mesh import Mesh


def _apart(a, b, tolerance=consistency.TOLERANCE):
    prints = tf.stack([consistency.fingerprint(tf.constant(a)),
                       consistency.fingerprint(tf.constant(b))])
    return bool(consistency.disagreeing(prints, tolerance)[1, 0])


def test_a_reordered_shifted_or_rescaled_batch_differs_the_same_one_does_not():
    batch = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
    assert not _apart(batch, batch.copy())
    assert _apart(batch, batch[::-1])  # the same rows, another order
    assert _apart(batch, np.roll(batch, 1, axis=0))
    changed = batch.copy()
    changed[7, 2] += 1e-3  # one element of 64
    assert _apart(batch, changed)


def test_tensors_fingerprinted_together_give_each_tensor_its_own_numbers(monkeypatch):
    # one segment sum over several tensors (static and unknown sizes, empty ones, an int) must
    # give what each tensor alone gives: the chunks split where FUSE_ELEMENTS says
    monkeypatch.setattr(consistency, "FUSE_ELEMENTS", 40)
    rng = np.random.default_rng(3)
    tensors = [rng.normal(size=shape).astype("float32")
               for shape in [(3, 4), (0,), (5,), (0, 2), (50,), (7,)]] + [np.arange(6)]
    alone = np.concatenate([consistency.fingerprint(t).numpy() for t in tensors])
    together = consistency.fingerprint(tensors).numpy()
    np.testing.assert_allclose(together, alone, rtol=1e-13, atol=1e-15)  # summed in another order
    assert together.shape == (consistency.PARTS * len(tensors),)

    @tf.function(input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([None])] * 2)
    def unknown(*values):
        return consistency.fingerprint(list(values))

    got = unknown(tensors[0], tensors[1], tensors[0], tensors[2]).numpy()
    np.testing.assert_allclose(got, np.concatenate([alone[:8], alone[:4], alone[8:12]]),
                               rtol=1e-13, atol=1e-15)


def test_the_weight_tolerance_forgives_a_last_bit_and_not_a_dropout_step():
    weights = np.random.default_rng(1).normal(size=(256, 64)).astype("float32")
    last_bit = np.nextafter(weights, np.float32(np.inf))  # every element one ulp up
    assert _apart(weights, last_bit)  # a batch would have to be bit for bit
    assert not _apart(weights, last_bit, consistency.WEIGHT_TOLERANCE)
    drifted = weights + np.random.default_rng(2).normal(scale=1e-4, size=weights.shape)
    assert _apart(weights, drifted.astype("float32"), consistency.WEIGHT_TOLERANCE)


def test_a_group_of_one_checks_nothing_and_the_interval_is_read_strictly():
    alone = Mesh().group("tensor", rank=0)
    assert consistency.assert_agree({"x": tf.ones([2])}, alone, 1, subject="batch", fix="") == []
    assert consistency.check_every({consistency.CHECK_EVERY_ENV: " 25 "}) == 25
    with pytest.raises(StrategyConfigError, match=r"TFDIST_CHECK_WEIGHTS_EVERY='often'"):
        consistency.check_every({consistency.CHECK_EVERY_ENV: "often"})
    assert consistency.when_due(1, 0, lambda: [tf.constant(1)]) == []


@pytest.mark.parametrize(("step", "due"), [(1, True), (2, False), (4, True), (5, False)])
def test_the_weight_check_runs_at_step_one_and_every_interval(step, due):
    ran = []

    def build():
        ran.append(step)
        return []

    @tf.function
    def traced(s):
        return consistency.when_due(s, 4, build)[0]

    assert bool(traced(tf.constant(step, tf.int64))) is due
