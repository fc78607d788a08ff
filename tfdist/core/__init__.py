"""The bottom floor: what every layer shares, with no TensorFlow, Keras or Horovod imported.

* `flavour`: which Keras this process trains with (``keras3`` or ``tf_keras``).
* `traits`: `StrategyTraits`, what a strategy says about how its job is laid out and started.
* `registry`: a strategy name -> its class and traits (built-ins answer without importing them).
* `environ`: this process's TF_CONFIG, peeked at without validating it.
* `detect`: which strategy ``"auto"`` means, for a running process or a job to launch.

Nothing here imports a module above it (`tfdist.cluster`, `tfdist.strategies`, ...); a unit test
over the package's imports keeps it so.
"""
