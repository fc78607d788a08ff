"""A chief-only Keras ``TensorBoard`` writer, the same under every strategy and both Kerases.

TensorFlow 2.21 no longer installs ``tensorboard``; Keras's ``TensorBoard`` callback then fails
only once ``fit`` starts ("TensorBoard is not installed"). tfdist depends on it, and checks for it
when the callback is made, before training.

Every process that runs ``fit`` gets a callback; only the chief's writes (``is_chief``: the
chief task, else ``worker:0``, Horovod rank 0, the first process of a pipeline). The others get a
no-op, so one event file per run holds the job's curves: the logs the chief sees are already
global (averaged over replicas by the strategy, or by Horovod's ``MetricAverageCallback``, which
`callbacks` puts first). Under ParameterServer only the chief (coordinator) runs ``fit``
(``model.fit`` with tf-keras, `tfdist.fit` with Keras 3).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from tfdist.core import flavour
from tfdist.errors import MissingDependencyError, format_error
from tfdist.logs import report_written

__all__ = ["tensorboard_callback"]


def tensorboard_callback(strategy: Any, log_dir: str | os.PathLike[str], **kwargs: Any) -> Any:
    """Keras's ``TensorBoard(log_dir, **kwargs)`` on the chief, a no-op callback elsewhere.

    Args:
        strategy: A tfdist strategy.
        log_dir: Where the chief writes ``train/`` (and ``validation/``) event files; the same
            on every process.
        **kwargs: Passed to ``TensorBoard`` (``histogram_freq``, ``update_freq``...).

    Raises:
        MissingDependencyError: ``tensorboard`` is not installed.

    Example:
        >>> import tempfile, tfdist
        >>> callback = tensorboard_callback(tfdist.get_strategy("default"), tempfile.mkdtemp())
        >>> type(callback).__name__
        'TensorBoard'
    """
    if importlib.util.find_spec("tensorboard") is None:
        raise MissingDependencyError(format_error(
            "The TensorBoard callback needs the tensorboard package, which TensorFlow 2.21 no "
            "longer installs.", received=f"log_dir={os.fspath(log_dir)!r}, no tensorboard",
            expected="tensorboard installed beside tensorflow",
            fix="pip install 'tensorboard~=2.21.0' (bash launch/setup.sh installs it)"))
    keras = flavour.get_keras()
    if strategy.is_chief:
        report_written("TensorBoard", log_dir)
        return keras.callbacks.TensorBoard(os.fspath(log_dir), **kwargs)
    return keras.callbacks.Callback()
