"""The checks of ``launch/horovod_examples.py`` on weight files written here (no job is run)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.horovod.test_horovod_examples import harness


def write_rank(run_dir: Path, rank: int, final: list[np.ndarray], *, package: str = "tf_keras",
               trainable: tuple[bool, ...] = (True, False)) -> None:
    arrays = {f"final/0/{i}": v for i, v in enumerate(final)}
    arrays.update({f"init/0/{i}": np.zeros_like(v) for i, v in enumerate(final)})
    np.savez(run_dir / f"rank-{rank}.npz", keras=np.array([package]),
             **{"trainable/0": np.array(trainable)}, **arrays)


def test_identical_trainable_weights_that_moved_pass(tmp_path: Path) -> None:
    write_rank(tmp_path, 0, [np.full(3, 0.5), np.ones(2)])
    write_rank(tmp_path, 1, [np.full(3, 0.5), np.full(2, 7.0)])  # moving statistics: own
    assert harness.compare_ranks(tmp_path, "tf-keras") == (True, 0.5, 1, "")


def test_a_trainable_weight_that_differs_by_one_ulp_fails(tmp_path: Path) -> None:
    value = np.full(3, 0.5, dtype=np.float32)
    write_rank(tmp_path, 0, [value, np.ones(2)])
    write_rank(tmp_path, 1, [np.nextafter(value, 1), np.ones(2)])
    identical, _, _, _ = harness.compare_ranks(tmp_path, "tf-keras")
    assert identical is False


def test_models_of_the_other_keras_are_reported(tmp_path: Path) -> None:
    for rank in (0, 1):
        write_rank(tmp_path, rank, [np.ones(3), np.ones(2)], package="keras")
    assert harness.compare_ranks(tmp_path, "tf-keras")[3] == (
        "asked for tf-keras, the models came from ['keras']")


def test_a_rank_without_weights_is_reported(tmp_path: Path) -> None:
    write_rank(tmp_path, 0, [np.ones(3), np.ones(2)])
    assert harness.compare_ranks(tmp_path, "tf-keras")[3] == "no weights written: rank-1.npz"


def test_generated_mnist_is_deterministic_and_shaped_like_keras(tmp_path: Path) -> None:
    with np.load(harness.write_mnist(tmp_path / "a.npz")) as a, \
            np.load(harness.write_mnist(tmp_path / "b.npz")) as b:
        assert a["x_train"].shape == (2048, 28, 28) and a["y_test"].dtype == np.uint8
        assert all(np.array_equal(a[k], b[k]) for k in ("x_train", "y_train", "x_test", "y_test"))


def test_a_checkout_without_the_examples_is_refused_with_the_fix(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        harness.main(["--horovod-src", str(tmp_path), "--scripts", "tensorflow2_mnist.py"])
    err = capsys.readouterr().err
    assert "tensorflow2_mnist.py not found under" in err and "git clone --branch v0.28.1" in err


def test_dry_run_prints_each_launch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    examples = tmp_path / "examples" / "tensorflow2"
    examples.mkdir(parents=True)
    (examples / "tensorflow2_mnist.py").write_text("")
    assert harness.main(["--horovod-src", str(tmp_path), "--scripts", "tensorflow2_mnist.py",
                         "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4  # 2 flavours x (gloo, mpi)
    assert lines[1].startswith("TF_USE_LEGACY_KERAS=0 ") and "--strategy horovod" in lines[1]
    assert "--mpi" in lines[1] and lines[3].startswith("TF_USE_LEGACY_KERAS=1 ")


def test_a_keras3_failure_is_expected_only_for_the_listed_cause() -> None:
    cause = "TypeError: Trainer.compile() got an unexpected keyword argument " \
            "'experimental_run_tf_function'"
    assert harness.failure("tensorflow2_keras_mnist.py", "keras3", 1, cause)[0] == "keras2-only"
    status, detail = harness.failure("tensorflow2_keras_mnist.py", "keras3", 1,
                                     "[1]<stderr>:ValueError: Weights for model 'sequential'\n"
                                     "RuntimeError: Horovod detected that one process exited")
    assert status == "fail"
    assert detail.startswith("exit 1: ValueError: Weights for model 'sequential'; last lines:")
    assert harness.failure("tensorflow2_keras_mnist.py", "tf-keras", 1, cause)[0] == "fail"
