"""What ``model.compile``/``fit``/``evaluate``/``predict`` mean under a tfdist strategy.

A script calls these on every process (or on the chief alone) and expects what one process
would return: the whole model's result on the whole input. Keras runs them as the strategy
distributes them, which is not always that: under ``horovod`` each rank evaluates and predicts
its slice of every batch, under ``parameter_server`` Keras 3 cannot predict at all, and a model
made in a ``pipeline`` or ``tensor`` strategy's scope without ``strategy.build_model`` trains
whole on every process, unsplit. So each strategy answers, before Keras runs a call:

* `TfdistStrategyMixin.check_model_call` raises for a call that would not mean what it says
  (the model-parallel strategies refuse a model ``build_model`` did not make, and an
  ``evaluate``/``predict`` that a peer will not join: on the chief alone);
* `TfdistStrategyMixin.check_model_from_outside` does the same for a model made outside every
  tfdist strategy's scope but called in one's scope or on its ``distribute_dataset``'s input
  (the model-parallel strategies refuse it: it is not split);
* in a model-parallel job of several processes (`claim_job`), a ``fit`` outside every
  strategy's scope before ``strategy.build_model`` made the job's model is refused
  (`ModelParallelMixin.check_unscoped_fit`): each process would train its own whole model;
* `TfdistStrategyMixin.explain_failed_call` turns a collective's failure that a misuse explains
  into that misuse's message (``evaluate`` on the chief alone under ``multi_worker``);
* `TfdistStrategyMixin.runs_locally` says which ``evaluate``/``predict`` calls run on this
  process alone (never one given a dataset the strategy already distributed), with no
  collective: the weights are the same on every process, so each computes the whole result
  itself (and a call on the chief alone works).

`install` wraps the trainer of this process's Keras once (Keras 3's ``TensorFlowTrainer``,
tf-keras's ``Model``: one implementation, two bindings; every tfdist strategy calls it when made);
a model made outside any tfdist strategy's scope, and called outside them, is left to Keras.
`run_locally` is the local run: the model's strategy set aside for the call, its compiled step
functions rebuilt.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import threading
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfdist.compat.models import in_own_thread

__all__ = ["install", "run_locally", "model_strategy", "call_arguments", "claim_job"]

_TRAINERS = {  # flavour: (module, class whose methods are wrapped)
    "keras3": ("keras.src.backend.tensorflow.trainer", "TensorFlowTrainer"),
    "tf_keras": ("tf_keras.src.engine.training", "Model"),
}
_STRATEGY_ATTRIBUTES = ("_distribute_strategy", "_distribution_strategy")  # Keras 3, tf-keras
_METHODS = ("compile", "fit", "evaluate", "predict")
_FUNCTIONS = ("train_function", "test_function", "predict_function")
_lock = threading.Lock()
_installed: list[str] = []
_job: list[Any] = []  # the model-parallel strategy of this process's job (`claim_job`)


def model_strategy(model: Any) -> Any | None:
    """The tfdist strategy whose scope ``model`` was made in (Keras records it), or whose
    ``build_model`` made it, else None.

    Example:
        >>> import keras
        >>> model_strategy(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])) is None
        True
    """
    for attribute in _STRATEGY_ATTRIBUTES:
        strategy = getattr(model, attribute, None)
        if hasattr(strategy, "check_model_call"):
            return strategy
    return getattr(model, "_tfdist_split_by", None)  # build_model's, made outside the scope


def call_arguments(signature: inspect.Signature, model: Any, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> dict[str, Any]:
    """A call's arguments by name (``**kwargs`` merged in); ``{}`` if they do not bind (Keras
    then says what is wrong).

    Example:
        >>> def fit(self, x=None, y=None, **kwargs): ...
        >>> call_arguments(inspect.signature(fit), None, (1,), {"validation_steps": 2})
        {'x': 1, 'validation_steps': 2}
    """
    try:
        arguments = dict(signature.bind(model, *args, **kwargs).arguments)
    except TypeError:
        return {}
    arguments.pop("self", None)
    arguments.update(arguments.pop("kwargs", {}))
    return arguments


def _distributed(x: Any) -> bool:
    """Whether ``x`` was distributed by a strategy already (``strategy.distribute_dataset``):
    such input is run as Keras runs it under that strategy (each process reads its shard)."""
    return isinstance(x, tf.distribute.DistributedDataset)


def run_locally(model: Any, call: Callable[[], Any]) -> Any:
    """``call()`` (an ``evaluate``/``predict`` of ``model``) on this process alone: the model's
    strategy set aside, so Keras neither splits the batches nor starts a collective.

    The step functions compiled for the strategy are dropped before and after, so the next
    ``fit`` traces its own again. Inside a strategy's scope the call runs in a thread of its
    own (the scope is the thread's).
    """
    # tf-keras also keeps the coordinator its parameter-server fit used, and would feed it
    aside = [a for a in (*_STRATEGY_ATTRIBUTES, "_cluster_coordinator") if hasattr(model, a)]
    saved = {a: getattr(model, a) for a in aside}
    for name in (*aside, *_FUNCTIONS):
        setattr(model, name, None)
    try:
        return in_own_thread(call, "tfdist-local-call") if tf.distribute.has_strategy() \
            else call()
    finally:
        for name, value in saved.items():
            setattr(model, name, value)
        for name in _FUNCTIONS:
            setattr(model, name, None)


def _strategy_at_hand(call: dict[str, Any]) -> Any | None:
    """The tfdist strategy a call on a model made outside every strategy's scope runs under:
    the one whose scope is current, else the one whose ``distribute_dataset`` made ``x``."""
    if tf.distribute.has_strategy():
        current = tf.distribute.get_strategy()
        if hasattr(current, "check_model_from_outside"):
            return current
    owner = getattr(call.get("x"), "_tfdist_distributed_by", None)
    return owner if hasattr(owner, "check_model_from_outside") else None


def claim_job(strategy: Any) -> None:
    """Records ``strategy`` as the one that splits this process's model across the job (a
    model-parallel strategy of several processes): a ``fit`` outside every strategy's scope is
    then its to judge (`check_unscoped_fit`)."""
    _job[:] = [strategy]


def _wrapped(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(getattr(original, "__wrapped_by_tfdist__", original))

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = call_arguments(signature, self, args, kwargs)
        strategy = model_strategy(self)
        if strategy is None:
            at_hand = _strategy_at_hand(call)
            if at_hand is not None:
                at_hand.check_model_from_outside(self, name, call)
            elif name == "fit" and _job:
                _job[0].check_unscoped_fit(self, call)
            return original(self, *args, **kwargs)
        strategy.check_model_call(self, name, call)
        if name in ("evaluate", "predict") and not _distributed(call.get("x")) and \
                strategy.runs_locally(name, call.get("x")):
            kwargs.pop("_use_cached_eval_dataset", None)  # fit's, made for the strategy
            return run_locally(self, lambda: original(self, *args, **kwargs))
        try:
            with strategy.model_call_scope(self, name, call):
                return original(self, *args, **kwargs)
        except tf.errors.OpError as err:
            strategy.explain_failed_call(name, err)  # raises a clearer error, or returns
            raise

    method.__wrapped_by_tfdist__ = getattr(  # type: ignore[attr-defined]
        original, "__wrapped_by_tfdist__", original)
    return method


def install() -> None:
    """Wraps ``compile``, ``fit``, ``evaluate`` and ``predict`` of this process's Keras (Keras
    3's trainer, or tf-keras's ``Model``) once per process; under Keras 3 after tfdist's shims,
    so these checks run first."""
    from tfdist.compat import install_keras3_shims
    from tfdist.core.flavour import keras_flavour

    flavour = keras_flavour()
    if flavour == "keras3":
        install_keras3_shims()
    with _lock:
        if flavour in _installed:
            return
        module, name = _TRAINERS[flavour]
        cls = getattr(importlib.import_module(module), name)
        for method in _METHODS:
            # On the class that defines it: Keras 3's compile_from_config (load_model) compiles
            # only when ``type(model).compile is Trainer.compile``, its own base's.
            owner = next(klass for klass in cls.__mro__ if method in vars(klass))
            setattr(owner, method, _wrapped(method, getattr(owner, method)))
        _installed.append(flavour)
