"""What the model-parallel engines need from Keras that the two Kerases give differently.

The pipeline (`tfdist.pipeline`) and the tensor layers (`tfdist.tensor`, the tensor strategy)
read these: a model described without allocating its weights (`abstract_build`), a stage's
regularization terms (`weight_losses`, `call_losses`), and an optimizer made outside the
strategy's scope bound to it (`bind_unbuilt_optimizer`) or built now (`build_optimizer`), and
the step methods a model's own class overrides, which they would leave out
(`refuse_step_overrides`), and the states of the layers' random seed generators
(`seed_states`), which the tensor strategy makes the same on every shard.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from tfdist.core.flavour import KerasFlavour, flavour_of, get_keras, keras_flavour  # noqa: F401 - get_keras: the examples

__all__ = ["abstract_build", "bind_unbuilt_optimizer", "build_optimizer", "call_losses",
           "clipping_off", "functional_class", "in_own_thread", "initial_values", "is_graph_model",
           "metrics_scope", "refuse_model_shape", "refuse_step_overrides", "seed_states",
           "step_overrides", "weight_losses"]

STEP_METHODS = ("train_step", "test_step", "predict_step", "compute_loss")
"""What a model class may override to change what ``fit``/``evaluate``/``predict`` do."""
_KERAS_PACKAGES = ("keras", "tf_keras", "keras_hub")


def bind_unbuilt_optimizer(optimizer: Any, strategy: Any) -> bool:
    """Makes a Keras 3 optimizer not yet built create its slots under ``strategy``; returns
    whether it did.

    Keras 3's TensorFlow optimizer keeps the strategy in scope when it was constructed and creates
    its slots (Adam's moments, SGD's momentum) under that strategy: one constructed outside
    ``strategy.scope()`` fails in its first ``fit`` with "Mixing different tf.distribute.Strategy
    objects". A tf-keras optimizer keeps it too, and updates its moving averages (``use_ema``)
    under it ("Must not nest tf.distribute.Strategy scopes"). Only for a strategy whose variables
    are plain per process (the pipeline): under a mirrored strategy the optimizer's own variables
    must be mirrored too, so there the optimizer has to be constructed inside the scope.

    Example:
        >>> import keras
        >>> import tensorflow as tf
        >>> bind_unbuilt_optimizer(keras.optimizers.Adam(), tf.distribute.get_strategy())
        True
    """
    if not hasattr(optimizer, "_distribution_strategy") or _built(optimizer):
        return False
    optimizer._distribution_strategy = strategy
    return True


def build_optimizer(optimizer: Any, variables: list[Any], strategy: Any) -> None:
    """Creates an optimizer's slots for ``variables`` now, under ``strategy``, if it has not
    yet (Keras 3, and tf-keras's optimizers but the legacy ones): a ``tf.function`` whose first
    trace creates variables traces again (the second time without), so a step that builds the
    optimizer as it first runs is traced twice.

    Example:
        >>> import keras
        >>> import tensorflow as tf
        >>> adam, weight = keras.optimizers.Adam(), keras.Variable([1.0])
        >>> build_optimizer(adam, [weight], tf.distribute.get_strategy())
        >>> adam.built
        True
    """
    if optimizer is None or not hasattr(optimizer, "build") or _built(optimizer):
        return
    with strategy.scope():
        optimizer.build(variables)


def _built(optimizer: Any) -> bool:
    """Whether ``optimizer`` has made its slots (a tf-keras one has no ``built``: it holds only
    its iteration counter before)."""
    if hasattr(optimizer, "built"):
        return bool(optimizer.built)
    variables = getattr(optimizer, "variables", ())
    return len(variables() if callable(variables) else variables) > 1


def weight_losses(model: Any) -> list[Any]:
    """``model.losses`` that depend on variables only (weight regularizers; in tf-keras also
    callables given to ``add_loss``), computed now: tf-keras keeps them as callables per layer,
    Keras 3 as each variable's ``regularizer``.

    Example:
        >>> keras = get_keras()
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(
        ...     1, kernel_initializer="ones", kernel_regularizer=keras.regularizers.L2(0.5))])
        >>> [float(loss) for loss in weight_losses(model)]
        [1.0]
    """
    if flavour_of(model) == "tf_keras":
        found = (c() for layer in model._flatten_layers() for c in layer._callable_losses)
        return [loss for loss in found if loss is not None]
    return [v.regularizer(v) for v in model.trainable_weights if v.regularizer is not None]


def call_losses(model: Any) -> list[Any]:
    """The losses ``model``'s last call added (activity regularizers, ``add_loss`` in
    ``call``): read them right after the call, in the same graph. Both Kerases clear them when
    a call starts; tf-keras keeps a functional model's symbolic ones apart.

    Example:
        >>> import numpy as np
        >>> keras = get_keras()
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(
        ...     1, kernel_initializer="ones", activity_regularizer=keras.regularizers.L1(1.0))])
        >>> _ = model(np.ones((2, 2), "float32"))
        >>> [float(loss) for loss in call_losses(model)]  # |2| + |2|, over 2 rows
        [2.0]
    """
    if flavour_of(model) == "tf_keras":
        return [loss for layer in model._flatten_layers() for loss in layer._eager_losses]
    return [loss for layer in model._flatten_layers() for loss in layer._get_own_losses()]


@contextlib.contextmanager
def abstract_build(flavour: KerasFlavour | None = None) -> Iterator[None]:
    """A context where building a Keras model allocates no memory for its weights.

    Layers get their shapes and configs, and outputs their symbolic shapes, but no weights.
    Keras 3: every variable made from an initializer (all layer weights, metric and seed
    states) is left uninitialised, as ``StatelessScope(initialize_variables=False)`` leaves it,
    and dropped afterwards; unlike that scope, a variable made from a value (an optimizer's
    iteration count and learning rate, made when a model compiles itself in its constructor)
    is allowed, and made (a few scalars). tf-keras builds in a throwaway ``tf.Graph``. The
    pipeline describes a whole model this way and then builds one stage for real.

    Example:
        >>> keras = get_keras()
        >>> with abstract_build():
        ...     model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        ...     model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
        >>> model.count_params()
        8
    """
    if (flavour or keras_flavour()) == "tf_keras":
        import tensorflow as tf

        with tf.Graph().as_default(), _initializers_kept():
            yield
        return
    from keras.src.backend.common import global_state
    from keras.src.backend.common.variables import register_uninitialized_variable
    from keras.src.backend.tensorflow.core import Variable

    def deferred(variable: Any, initializer: Any) -> None:
        variable._value = None
        variable._initializer = initializer
        register_uninitialized_variable(variable)

    def stay_deferred(variable: Any) -> None:
        """A layer's symbolic call (MultiHeadAttention's) ends in a ``StatelessScope`` whose exit
        initialises every deferred variable: here they stay deferred (else each re-registers
        itself in the list being walked, and that walk never ends)."""

    key = "uninitialized_variables"
    before = list(global_state.get_global_attribute(key, []) or [])
    real = Variable._initialize_with_initializer, Variable._deferred_initialize
    Variable._initialize_with_initializer, Variable._deferred_initialize = deferred, stay_deferred
    try:
        yield
    finally:
        Variable._initialize_with_initializer, Variable._deferred_initialize = real
        global_state.set_global_attribute(key, before)


@contextlib.contextmanager
def initial_values(value_of: Callable[[Any], Callable[[], Any] | None]) -> Iterator[None]:
    """Keras 3: a context where each variable made from an initializer first asks
    ``value_of(variable)`` for its initial value (a function returning it; None: its own
    initializer), so a stage whose weights are redrawn is not drawn twice. tf-keras: no
    effect (its stages draw, then take their values).

    Example:
        >>> import numpy as np
        >>> keras = get_keras()
        >>> ones = lambda v: (lambda: np.ones(v.shape, "float32")) if v.path.endswith(
        ...     "kernel") else None
        >>> with initial_values(ones):
        ...     layer = keras.layers.Dense(2)
        ...     layer.build((None, 3))
        >>> float(np.asarray(layer.kernel).sum()) == (6.0 if keras_flavour() == "keras3" else
        ...                                          float(np.asarray(layer.kernel).sum()))
        True
    """
    if keras_flavour() != "keras3":
        yield
        return
    from keras.src.backend.tensorflow.core import Variable

    real = Variable._initialize_with_initializer

    def initialise(variable: Any, initializer: Any) -> None:
        value = value_of(variable)
        if value is None:
            real(variable, initializer)
        else:
            variable._initialize(value)

    Variable._initialize_with_initializer = initialise
    try:
        yield
    finally:
        Variable._initialize_with_initializer = real


@contextlib.contextmanager
def _initializers_kept() -> Iterator[None]:
    """tf-keras: each variable made keeps the initializer that drew it (``_tfdist_initializer``,
    read by `tfdist.pipeline.initial.record`), as a Keras 3 variable left uninitialised does."""
    from tf_keras.src.engine import base_layer_utils

    make_variable = base_layer_utils.make_variable

    def keeping(*args: Any, **kwargs: Any) -> Any:
        variable = make_variable(*args, **kwargs)
        variable._tfdist_initializer = kwargs.get("initializer")
        return variable

    base_layer_utils.make_variable = keeping
    try:
        yield
    finally:
        base_layer_utils.make_variable = make_variable


def metrics_scope(model: Any) -> Any:
    """Where a stage model makes the metrics it holds: tf-keras compiles a functional model
    inside the strategy it was built in and refuses variables made elsewhere, so there; Keras 3
    needs no scope.

    Example:
        >>> keras = get_keras()
        >>> with metrics_scope(keras.Sequential([keras.Input((1,))])):
        ...     pass
    """
    if flavour_of(model) == "tf_keras":
        return model.distribute_strategy.scope()
    return contextlib.nullcontext()


def functional_class(flavour: KerasFlavour) -> type:
    """The functional model class of ``flavour`` (stage models subclass it).

    Example:
        >>> functional_class(keras_flavour()).__name__
        'Functional'
    """
    if flavour == "tf_keras":
        from tf_keras.src.engine.functional import Functional
    else:
        from keras.src.models.functional import Functional
    return Functional


def step_overrides(model: Any) -> list[str]:
    """The `STEP_METHODS` that ``model``'s class defines outside Keras (``Class.method``).

    Example:
        >>> keras = get_keras()
        >>> class Custom(keras.Model):
        ...     def train_step(self, data):
        ...         return super().train_step(data)
        >>> inputs = keras.Input((2,))
        >>> step_overrides(Custom(inputs, keras.layers.Dense(1)(inputs)))
        ['Custom.train_step']
        >>> step_overrides(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))
        []
    """
    found = []
    for method in STEP_METHODS:
        owner = next((cls for cls in type(model).__mro__ if method in vars(cls)), None)
        if owner is not None and owner.__module__.split(".")[0] not in _KERAS_PACKAGES:
            found.append(f"{owner.__name__}.{method}")
    return found


def refuse_step_overrides(model: Any, strategy: str) -> None:
    """Refuses a model whose class overrides a step method: ``strategy`` builds its shards or
    stages from the layers' configs, so the override would be silently left out.

    Raises:
        StrategyConfigError: naming each override.
    """
    from tfdist.errors import StrategyConfigError, format_error

    overrides = step_overrides(model)
    if overrides:
        raise StrategyConfigError(format_error(
            f"The {strategy} strategy builds its own model from the layers of yours, and runs "
            f"its own steps: {', '.join(overrides)} would be silently ignored.",
            received=f"a {type(model).__name__} overriding {', '.join(overrides)}",
            expected="a keras.Model or keras.Sequential whose steps are Keras's own",
            fix="move what the override adds into layers (a loss into the compiled loss, a "
                "penalty into add_loss), or train it with a data-parallel strategy "
                "(multi_worker, horovod), which runs your train_step"))


def is_graph_model(model: Any) -> bool:
    """Whether ``model`` is a graph of layers (functional, or ``Sequential``), not a subclass
    whose ``call`` is Python code the model-parallel engines cannot read.

    Example:
        >>> keras = get_keras()
        >>> class Sub(keras.Model):
        ...     def call(self, x):
        ...         return x
        >>> is_graph_model(Sub()), is_graph_model(keras.Sequential([keras.Input((2,))]))
        (False, True)
    """
    if getattr(model, "_is_graph_network", False):  # tf-keras
        return True
    return any(cls.__name__ in ("Functional", "Sequential")
               and cls.__module__.split(".")[0] in _KERAS_PACKAGES
               for cls in type(model).__mro__)


def refuse_model_shape(model: Any, strategy: str, single_output: bool = False) -> None:
    """Refuses, before anything is built or waits, a model ``strategy`` cannot split: a
    subclassed model (no layer graph; it once failed with ``AttributeError: ... 'outputs'``),
    one overriding a step method (`refuse_step_overrides`) and, with ``single_output``, a
    model of several outputs (it once failed with raw Keras errors).

    Raises:
        StrategyConfigError: naming what the model is and the fix.
    """
    from tfdist.errors import StrategyConfigError, format_error

    if not is_graph_model(model):
        raise StrategyConfigError(format_error(
            f"The {strategy} strategy splits a model by its graph of layers; a subclassed "
            f"{type(model).__name__} computes in Python code (its call), which has none.",
            received=f"a {type(model).__name__} subclassing keras.Model",
            expected="a functional keras.Model (built from keras.Input) or keras.Sequential",
            fix="build the same layers with the functional API, or train it with a "
                "data-parallel strategy (multi_worker, horovod), which runs any model"))
    refuse_step_overrides(model, strategy)
    outputs = getattr(model, "outputs", None) or []
    if single_output and len(outputs) > 1:
        raise StrategyConfigError(format_error(
            f"The {strategy} strategy trains a model of one output: its last stage computes "
            "the one loss.", received=f"{model.name!r} with {len(outputs)} outputs",
            expected="a model with one output",
            fix="concatenate the outputs into one (and split it in a single loss), or train "
                "the model with a data-parallel strategy (multi_worker, horovod)"))


def seed_states(model: Any) -> list[Any]:
    """The state variables of the random seed generators of ``model``'s layers (a ``Dropout``
    draws its masks from its generator's state), in layer order; ``[]`` under tf-keras, whose
    layers draw from TensorFlow's global seed instead.

    Example:
        >>> keras = get_keras()
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dropout(0.5),
        ...                           keras.layers.Dense(1)])
        >>> [v.name for v in seed_states(model)]
        ['seed_generator_state']
    """
    flatten = getattr(model, "_flatten_layers", None)
    if flatten is None or flavour_of(model) != "keras3":
        return []
    return [generator.state for layer in flatten(include_self=True)
            for generator in getattr(layer, "_seed_generators", [])]


def in_own_thread(call: Callable[[], Any], name: str) -> Any:
    """``call()`` in a thread of its own, whose distribution context is the default one (a
    strategy's scope belongs to the thread that entered it); its exception re-raised here.

    Example:
        >>> in_own_thread(lambda: 1 + 1, "example")
        2
    """
    result: list[Any] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            failure.append(err)

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


@contextlib.contextmanager
def clipping_off(optimizer: Any) -> Iterator[None]:
    """The optimizer's own norm clipping off, for a step that clips over every process's part
    itself (tensor shards, ZeRO partitions: a norm over one part is not the model's)."""
    saved = {key: getattr(optimizer, key, None) for key in ("clipnorm", "global_clipnorm")}
    for key in saved:
        setattr(optimizer, key, None)
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(optimizer, key, value)
