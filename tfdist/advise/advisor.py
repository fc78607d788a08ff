"""`advise(model, cluster)`: profile the model, get the network constants, rank every layout.

Example:
    >>> from tfdist.core import flavour
    >>> from tfdist.advise.model import Link
    >>> keras = flavour.get_keras()
    >>> def build():
    ...     return keras.Sequential([keras.Input((16,)), keras.layers.Dense(8),
    ...                              keras.layers.Dense(2)])
    >>> link = Link(alpha=1e-3, beta=1e-9, gamma=1e-10)
    >>> net = Constants(p2p=link, backends={"tf": link}, gamma=1e-10, processes=2, machine={},
    ...                 samples={})
    >>> advice = advise(build, 2, batch=32, constants=net, repeats=2)
    >>> advice.best.candidate.label
    'default x1'
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

from tfdist.advise import network
from tfdist.advise.candidates import Candidate, Cluster, as_cluster, candidates
from tfdist.advise.model import Link
from tfdist.advise.network import Constants
from tfdist.advise.predict import IN_GRAPH, Prediction, predict, rank
from tfdist.advise.profile import ModelProfile, profile_model
from tfdist.core.flavour import keras_flavour
from tfdist.errors import AdviseError, format_error

__all__ = ["Advice", "advise", "build", "get_constants", "links_of"]

_LOCAL = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}


@dataclasses.dataclass(frozen=True)
class Advice:
    """The ranked predictions and what they were computed from.

    Attributes:
        predictions: Fastest fitting candidate first; those that do not fit last.
        profile: The model's measured costs.
        constants: The network constants.
        cluster: The cluster advised for.
        batch: The global batch.
        script: The training script the command lines name.
    """

    predictions: tuple[Prediction, ...]
    profile: ModelProfile
    constants: Constants
    cluster: Cluster
    batch: int
    script: str = "train.py"

    @property
    def best(self) -> Prediction:
        return self.predictions[0]

    def command(self, prediction: Prediction | None = None) -> str:
        """The command line that runs ``prediction`` (default: the winner)."""
        return " ".join((prediction or self.best).candidate.launch_argv(self.script))

    def prediction(self, label: str) -> Prediction:
        """The prediction of the candidate called ``label`` (``"multi_worker x2"``)."""
        for p in self.predictions:
            if p.candidate.label == label:
                return p
        labels = [p.candidate.label for p in self.predictions]
        raise KeyError(f"no candidate {label!r}; have {labels}")


def build(model_or_fn: Any) -> Any:
    """``model_or_fn`` if it is a model, else what calling it returns in the ``default``
    strategy's scope.

    Raises:
        AdviseError: the function fails or returns something without layers.
    """
    if hasattr(model_or_fn, "layers"):
        return model_or_fn
    if not callable(model_or_fn):
        raise AdviseError(format_error(
            "The model is neither a Keras model nor a function that builds one.",
            received=repr(model_or_fn), expected="a keras.Model or a zero-argument function",
            fix="pass the model, or e.g. lambda: build_model(keras, ...)"))
    from tfdist.strategies import get_strategy

    try:
        # In a strategy's scope, as a job builds it (`build_model`): a model made outside any
        # steps faster than the jobs' (the deep MLP's tf-keras step at 128 rows: 7.0 ms
        # against 11.2 here), and the profile would promise that speed.
        model = get_strategy("default").build_model(model_or_fn)
    except Exception as err:  # noqa: BLE001 - any failure of user code is reported the same way
        raise AdviseError(format_error(
            f"The model could not be built: {type(err).__name__}: {err}",
            received=getattr(model_or_fn, "__name__", repr(model_or_fn)),
            expected="a function that returns a built Keras model",
            fix="run the build function alone to see the error; give keras.Input full shapes")
        ) from err
    if not hasattr(model, "layers"):
        raise AdviseError(format_error(
            "The build function did not return a Keras model.", received=repr(model)[:80],
            expected="a keras.Model", fix="return the model from the build function"))
    return model


def _remote_hosts(cluster: Cluster) -> list[str]:
    here = _LOCAL | {socket.gethostname(), socket.getfqdn()}
    return [h for h in cluster.host_names if h not in here]


def get_constants(cluster: Cluster, constants: Constants | str | os.PathLike[str] | None,
                  backends: Sequence[str] = ("tf", "horovod"), log: Any = None) -> Constants:
    """``constants`` as given or loaded from a file; else the cache; else a fresh probe.

    Raises:
        AdviseError: the cluster names other hosts and no constants were given (the probe
            runs on this machine only), or the probe failed.
    """
    if isinstance(constants, Constants):
        return constants
    if constants is not None:
        return network.load(constants)
    remote = _remote_hosts(cluster)
    if remote:
        raise AdviseError(format_error(
            f"Cannot probe the network of hosts {remote} from here: the probe runs 2 processes "
            "on this machine only.", received=f"hosts {list(cluster.host_names)}",
            expected="constants measured on those hosts",
            fix="run `tfdist-advise --probe-only --constants net.json` on one of them (over "
            "the same network), copy net.json here and pass --constants net.json"))
    cached = network.default_path()
    if cached.exists():
        known = network.load(cached)
        if known.in_graph_link("tf") is not None:
            return known  # else measured before the in-graph probe: probe again, below
    measured = network.probe(backends=backends, log=log)
    network.save(measured, cached)
    return measured


def links_of(net: Constants) -> dict[str, Link]:
    """The links `predict` prices with: each backend's (else the raw link as ``"tf"``), and
    TF's in-graph link (`predict.IN_GRAPH`) where the constants have one.

    Example:
        >>> link = Link(alpha=1e-3, beta=1e-9)
        >>> sorted(links_of(Constants(link, {"tf": link}, 0.0, 2, {}, {}, {"tf": link})))
        ['tf', 'tf in-graph']
    """
    links = dict(net.backends) or {"tf": net.p2p}
    in_graph = net.in_graph_link("tf")
    if in_graph is not None:
        links[IN_GRAPH] = in_graph
    return links


def advise(model: Any, cluster: Any, *, batch: int, data: Any = None,
           constants: Constants | str | os.PathLike[str] | None = None,
           device_memory: float | None = None, script: str = "train.py",
           micro_batches: Sequence[int] = (2, 4, 8), max_ps: int = 2,
           backends: Sequence[str] = ("tf", "horovod"), repeats: int = 5,
           profile: ModelProfile | None = None,
           keep: Callable[[Candidate], bool] | None = None,
           flavour: str | None = None) -> Advice:
    """Predicts the step time of every layout of ``model`` on ``cluster`` and ranks them.

    Args:
        model: A built Keras model, or a function that builds one.
        cluster: A process count, host list (``"node1:2,node2:2"``), `ClusterSpec` or `Cluster`.
        batch: The global batch size.
        data: Optional sample inputs (see `profile_model`): real ids make the embedding
            traffic exact.
        constants: Network constants, or a JSON file of them; None: the cache, else a probe.
        device_memory: Bytes one process may hold (None: no limit).
        script: The script the printed command lines run.
        micro_batches: Pipeline micro-batch counts to consider.
        max_ps: Most parameter servers to consider.
        backends: All-reduce backends to probe and consider.
        repeats: Timed calls per profile measurement.
        profile: A profile measured before (skips measuring the model).
        keep: Only candidates for which this returns True.
        flavour: The Keras the jobs train with (``"keras3"``, ``"tf_keras"``): whose measured
            layout overheads (`network.Constants.overheads`) apply. Default: this process's.

    Raises:
        AdviseError: the model does not build, the constants cannot be had, or no layout fits
            ``device_memory``.
    """
    shape = as_cluster(cluster, device_memory)
    net = get_constants(shape, constants, backends)
    prof = profile or profile_model(build(model), batch, data=data, repeats=repeats)
    links = links_of(net)
    offered = [c for c in candidates(shape, batch, micro_batches, max_ps, tuple(links),
                                     layers=len(prof.names), heads=prof.heads)
               if keep is None or keep(c)]
    overheads = net.overheads_of(flavour or keras_flavour())
    ranked = tuple(rank([predict(c, prof, links, shape, batch, overheads) for c in offered]))
    if not ranked or not ranked[0].fits:
        least = min(ranked, key=lambda p: p.memory_bytes) if ranked else None
        raise AdviseError(format_error(
            "The model fits no layout of this cluster.",
            received=f"device_memory={shape.device_memory:g} bytes, {shape.processes} processes",
            expected=(f"at least {least.memory_bytes:.3g} bytes per device (the smallest need, "
                      f"{least.candidate.label})" if least else "a layout to consider"),
            fix="add processes (more pipeline stages, tensor shards or ps shards), a smaller "
            "batch, or devices with more memory"))
    return Advice(ranked, prof, net, shape, batch, script)
