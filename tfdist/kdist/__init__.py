"""Keras's own distribution API (``keras.distribution``) on the TensorFlow backend.

Keras 3 teaches ``DeviceMesh``, ``LayoutMap``, ``DataParallel``, ``ModelParallel``,
``set_distribution`` and ``initialize``; its TensorFlow backend implements none of it (its
``distribution_lib`` opens with "DO NOT USE ... just a prototype"). Under ``tfdist-launch`` the
start-up hook (`tfdist.startup_hook`) installs this package when Keras is imported, so a script
written for Keras's distribution guide runs unchanged on TensorFlow; ``import tfdist`` does the
same for a process started otherwise. What maps onto what:

* `tfdist.kdist.job`: the job (``initialize``, ``num_processes``, ``process_id``,
  ``list_devices``: one device per process, in rank order);
* `tfdist.kdist.mesh`: a ``DeviceMesh`` as tfdist's process mesh (batch axis -> data, model
  axis -> tensor);
* `tfdist.kdist.layout`: a ``LayoutMap`` as the tensor engine's splits, honoured exactly or
  refused before training;
* `tfdist.kdist.backend`: the backend functions and ``set_distribution`` (``DataParallel`` ->
  ``multi_worker``, ``ModelParallel`` -> ``tensor``);
* `tfdist.kdist.shard`: a model created under ``ModelParallel`` sharded in place at its first
  ``compile``.

``TFDIST_KERAS_DISTRIBUTION=off`` leaves Keras as released.
"""

from __future__ import annotations

__all__ = ["install"]


def install() -> None:
    """Installs tfdist's implementation into Keras 3's TensorFlow backend (once; nothing under
    tf-keras, another backend, or ``TFDIST_KERAS_DISTRIBUTION=off``)."""
    from tfdist.kdist.backend import install as install_backend

    install_backend()
