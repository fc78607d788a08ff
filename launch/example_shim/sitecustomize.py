"""Shortens an unchanged training script and records its weights (`launch/horovod_examples.py`).

Python imports ``sitecustomize`` at start-up from ``PYTHONPATH``; the harness puts this folder
there, so every rank of a job runs it before the script. It does nothing unless
``TFDIST_EXAMPLE_OUT`` is set. Then, without editing the script, it:

* caps the script's own calls (made from ``__main__``, not from Keras or TensorFlow) of
  ``Model.fit`` to ``TFDIST_EXAMPLE_EPOCHS`` epochs of at most ``TFDIST_EXAMPLE_STEPS`` steps,
  and of ``tf.data.Dataset.take(n)`` to ``n <= TFDIST_EXAMPLE_TAKE``;
* makes ``keras.datasets.mnist.load_data`` (both Kerases) read ``TFDIST_EXAMPLE_MNIST``, a
  locally generated file, instead of downloading (any other download raises);
* keeps every Keras model the script calls, records its weights after its first call (before
  any update), and at exit writes them with the final weights to
  ``$TFDIST_EXAMPLE_OUT/rank-<rank>.npz`` (``init/<model>/<i>``, ``final/<model>/<i>``,
  ``trainable/<model>``: which weights are trainable, and
  ``keras``: the packages the models came from, ``keras`` or ``tf_keras``).

Patches are applied when the module that defines the patched object is imported, so nothing is
imported here that the script would not import itself.

Example:
    ``TFDIST_EXAMPLE_OUT=out PYTHONPATH=launch/example_shim python train.py``
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

OUT_ENV = "TFDIST_EXAMPLE_OUT"
MNIST_ENV = "TFDIST_EXAMPLE_MNIST"
RANK_ENVS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")

_models: list[Any] = []
_initial: dict[int, list[Any]] = {}


def _cap(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def _called_from_script(depth: int = 2) -> bool:
    return sys._getframe(depth).f_globals.get("__name__") == "__main__"


def _snapshot(model: Any) -> list[Any]:
    import numpy as np
    import tensorflow as tf

    with tf.init_scope():  # the first call may be a tf.function's trace
        return [np.array(w.numpy()) for w in model.weights]


def _track(model: Any) -> None:
    """Keeps ``model``; records its first weights at the first call where they have values.

    Keras 3's first call in ``fit`` is symbolic (its variables get values only after it), so
    the snapshot is retried at the next call, the trace of the first step.
    """
    index = next((i for i, m in enumerate(_models) if m is model), None)
    if index is None:
        index = len(_models)
        _models.append(model)
    if index in _initial:
        return
    try:
        values = _snapshot(model)
    except Exception:  # noqa: BLE001 - not initialised yet: the next call tries again
        return
    if all(v.shape == tuple(w.shape) for v, w in zip(values, model.weights, strict=True)):
        _initial[index] = values


def _write_weights() -> None:
    if not _models:
        return
    import numpy as np

    arrays = {}
    for index, model in enumerate(_models):
        for i, value in enumerate(_initial.get(index, [])):
            arrays[f"init/{index}/{i}"] = value
        for i, value in enumerate(_snapshot(model)):
            arrays[f"final/{index}/{i}"] = value
        arrays[f"trainable/{index}"] = np.array([bool(w.trainable) for w in model.weights])
    arrays["keras"] = np.array(sorted({type(m).__module__.split(".")[0] for m in _models}))
    rank = next((os.environ[k] for k in RANK_ENVS if k in os.environ), "0")
    np.savez(Path(os.environ[OUT_ENV]) / f"rank-{rank}.npz", **arrays)


def _patch_model(model_class: type) -> None:
    call, fit = model_class.__call__, model_class.fit

    @functools.wraps(call)
    def tracked_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        outputs = call(self, *args, **kwargs)
        if self.built:
            _track(self)
        return outputs

    @functools.wraps(fit)
    def capped_fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _called_from_script():
            asked = (kwargs.get("epochs", 1), kwargs.get("steps_per_epoch"))
            steps = asked[1] or _cap("TFDIST_EXAMPLE_STEPS", 5)
            kwargs["steps_per_epoch"] = min(steps, _cap("TFDIST_EXAMPLE_STEPS", 5))
            kwargs["epochs"] = min(asked[0], _cap("TFDIST_EXAMPLE_EPOCHS", 2))
            print(f"[example-shim] fit: epochs {asked[0]} -> {kwargs['epochs']}, steps per "
                  f"epoch {asked[1]} -> {kwargs['steps_per_epoch']}", file=sys.stderr)
        return fit(self, *args, **kwargs)

    model_class.__call__, model_class.fit = tracked_call, capped_fit


def _patch_take(module: ModuleType) -> None:
    take = module.DatasetV2.take

    @functools.wraps(take)
    def capped_take(self: Any, count: Any, name: Any = None) -> Any:
        if _called_from_script() and isinstance(count, int):
            capped = min(count, _cap("TFDIST_EXAMPLE_TAKE", 10))
            print(f"[example-shim] take: {count} -> {capped}", file=sys.stderr)
            count = capped
        return take(self, count, name=name)

    module.DatasetV2.take = capped_take


def _local_get_file(fname: str | None = None, origin: str | None = None, **kwargs: Any) -> str:
    if str(origin).endswith("/mnist.npz") and os.environ.get(MNIST_ENV):
        return os.environ[MNIST_ENV]
    raise RuntimeError(f"example shim: no downloads here (fname={fname}, origin={origin}); "
                       f"generate the data locally and name it in {MNIST_ENV}")


def _patch_mnist(module: ModuleType) -> None:
    module.get_file = _local_get_file


PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "keras.src.models.model": lambda m: _patch_model(m.Model),
    "tf_keras.src.engine.training": lambda m: _patch_model(m.Model),
    "tensorflow.python.data.ops.dataset_ops": _patch_take,
    "keras.src.datasets.mnist": _patch_mnist,
    "tf_keras.src.datasets.mnist": _patch_mnist,
}


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, patch: Callable[[ModuleType], None]) -> None:
        self._loader, self._patch = loader, patch

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._patch(module)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Applies ``PATCHES[name]`` right after module ``name`` is executed."""

    def __init__(self) -> None:
        self._finding: set[str] = set()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in PATCHES or name in self._finding:
            return None
        self._finding.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._finding.discard(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader, PATCHES[name])
        return spec


def _run_shadowed_sitecustomize() -> None:
    """Runs the ``sitecustomize`` this one hides: the next one on ``sys.path``, as Python would
    have without this folder first on ``PYTHONPATH`` (the checkout's, under the test suite: its
    lean Keras import, process census, warm starts and horovodrun's recorded build checks)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        path = os.path.join(os.path.abspath(entry or os.curdir), "sitecustomize.py")
        if os.path.dirname(path) == here or not os.path.isfile(path):
            continue
        spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", path)
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            # `from sitecustomize import X` keeps working for the names the hidden one defines
            # (as tfdist's start-up hook does for the one it hides: this one)
            mine = globals()
            for name, value in vars(module).items():
                if not name.startswith("__"):
                    mine.setdefault(name, value)
        return


if os.environ.get(OUT_ENV):
    sys.meta_path.insert(0, _PatchOnImport())
    atexit.register(_write_weights)
_run_shadowed_sitecustomize()
