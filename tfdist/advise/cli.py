"""``tfdist-advise``: predict and rank every layout of a model on a cluster, and say why.

Example:
    >>> args = parse_args(["keras_examples/deep_mlp.py:build_model", "--batch", "64",
    ...                    "--arg", "width=128", "--cluster", "2", "--dry-run"])
    >>> args.target, args.kwargs["width"], args.cluster
    ('keras_examples/deep_mlp.py:build_model', 128, '2')
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import json
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tfdist.advise import network, report
from tfdist.advise.advisor import advise, get_constants
from tfdist.advise.candidates import as_cluster, candidates
from tfdist.advise.cores import usable_cores
from tfdist.advise.script_check import check_import_safe, missing_function
from tfdist.errors import AdviseError, TfdistError, format_error

__all__ = ["parse_args", "load_target", "main"]

CONSTANTS_ENV = "TFDIST_ADVISE_CONSTANTS"
# The all-reduce backends the advisor has candidates for (`candidates.candidates`).
BACKENDS = ("tf", "horovod")


def _kwarg(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, received {text!r}")
    name, value = text.split("=", 1)
    try:
        return name, json.loads(value)
    except ValueError:
        return name, value


def _memory(text: str) -> float:
    units = {"KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
    for unit, scale in units.items():
        if text.upper().endswith(unit):
            return float(text[:-2]) * scale
    return float(text)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses ``argv`` (``sys.argv[1:]`` when None)."""
    parser = argparse.ArgumentParser(prog="tfdist-advise", description=__doc__.splitlines()[0])
    parser.add_argument("target", nargs="?", help="the build function: 'path/script.py:fn' or "
                        "'package.module:fn' (a 'keras' parameter gets the Keras in use)")
    model = parser.add_argument_group("model")
    model.add_argument("--arg", dest="kwargs", type=_kwarg, action="append", default=[],
                       metavar="NAME=VALUE", help="keyword argument of the build function (JSON)")
    model.add_argument("--batch", type=int, default=64, help="global batch size (default 64)")
    cluster = parser.add_argument_group("cluster")
    cluster.add_argument("--cluster", default="2", help="processes ('4') or hosts "
                         "('node1:2,node2:2'); default 2")
    cluster.add_argument("--device-memory", "--memory-per-process", dest="device_memory",
                         type=_memory, help="bytes one process may hold, e.g. 16GB: layouts "
                         "that need more are ranked last (a ZeRO stage is then offered where "
                         "replicated multi_worker does not fit)")
    cluster.add_argument("--micro-batches", default="2,4,8", help="pipeline M to consider")
    cluster.add_argument("--max-ps", type=int, default=2, help="most parameter servers (2)")
    cluster.add_argument("--measure-cores", action="store_true",
                         help="on a shared machine: measure the cores the processes really get "
                         "(a 1-second busy-loop probe) instead of assuming all of them")
    cluster.add_argument("--backends", default="tf,horovod", help="all-reduce backends")
    net = parser.add_argument_group("network constants")
    net.add_argument("--constants", default=os.environ.get(CONSTANTS_ENV),
                     help=f"JSON of measured constants to reuse (default ${CONSTANTS_ENV}; "
                     "else the cache, else a probe)")
    net.add_argument("--probe-only", action="store_true",
                     help="probe the network here, write --constants (or the cache), stop")
    out = parser.add_argument_group("output")
    out.add_argument("--script", default="train.py", help="script the command lines run")
    out.add_argument("--json", type=Path, help="also write everything as JSON here")
    out.add_argument("--dry-run", action="store_true",
                     help="print what would be measured and considered, measure nothing")
    args = parser.parse_args(argv)
    args.kwargs = dict(args.kwargs)
    problem = (_micro_batches(args) or _backends(args) or _max_ps(args) or _target(args)
               or _cluster_fits_batch(args) or _json_path(args))
    if problem:
        parser.error(problem)
    return args


# Each check below runs before anything is measured: a bad flag must not cost a 20 s probe.


def _micro_batches(args: argparse.Namespace) -> str | None:
    try:
        values = tuple(int(m) for m in args.micro_batches.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        return format_error("--micro-batches must list pipeline micro-batch counts.",
                            received=f"--micro-batches {args.micro_batches}",
                            expected="comma-separated ints >= 1", fix="--micro-batches 2,4,8")
    args.micro_batches = values
    return None


def _backends(args: argparse.Namespace) -> str | None:
    args.backends = tuple(b for b in args.backends.split(",") if b)
    unknown = [b for b in args.backends if b not in BACKENDS]
    if unknown or not args.backends:
        return format_error("--backends names an all-reduce backend the advisor cannot model.",
                            received=f"--backends {','.join(args.backends) or repr('')}",
                            expected=f"a comma-separated subset of {', '.join(BACKENDS)}",
                            fix="--backends tf,horovod")
    return None


def _max_ps(args: argparse.Namespace) -> str | None:
    if args.max_ps < 0:
        return format_error("--max-ps is the most parameter servers to consider.",
                            received=f"--max-ps {args.max_ps}", expected="an int >= 0",
                            fix="--max-ps 2 (or 0 to leave parameter servers out)")
    return None


def _target(args: argparse.Namespace) -> str | None:
    if args.probe_only:
        return None
    if not args.target:
        return "a target (path/script.py:build_fn) is required unless --probe-only"
    location, colon, name = args.target.rpartition(":")
    expected = "'path/to/script.py:function' or 'package.module:function'"
    if not colon or not location or not name:
        return format_error("The target names no build function.", received=args.target,
                            expected=expected, fix=f"{args.target}:build_model")
    if location.endswith(".py") and not Path(location).is_file():
        return format_error(f"The target's script {location!r} does not exist.",
                            received=args.target, expected=expected,
                            fix="give the path of the script from this directory")
    if location.endswith(".py"):
        return missing_function(location, name)
    return _module_problem(location, name, expected)


def _module_problem(module: str, name: str, expected: str) -> str | None:
    """The problem with a ``package.module:function`` target: a module that cannot be found,
    or whose source binds no ``name`` (read, not imported; a compiled module is not read)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as err:
        spec, problem = None, str(err)
    else:
        problem = "no such module"
    if spec is None:
        return format_error(f"The target's module {module!r} cannot be found ({problem}).",
                            received=f"{module}:{name}", expected=expected,
                            fix="check the module's name and that it is on PYTHONPATH")
    origin = spec.origin or ""
    return missing_function(origin, name) if origin.endswith(".py") else None


def _cluster_value(text: str) -> int | str:
    """``--cluster``'s value: a process count where it is a number (``-1`` too, which
    `as_cluster` then refuses), else a host list.

    Example:
        >>> _cluster_value("4"), _cluster_value("-1"), _cluster_value("node1:2")
        (4, -1, 'node1:2')
    """
    stripped = text.strip()
    return int(stripped) if stripped.lstrip("+-").isdigit() else text


def _cluster_fits_batch(args: argparse.Namespace) -> str | None:
    try:
        shape = as_cluster(_cluster_value(args.cluster))
    except TfdistError as err:
        return str(err)
    if shape.processes > args.batch:
        return format_error(
            f"A global batch of {args.batch} cannot give each of {shape.processes} training "
            "processes a sample.", received=f"--cluster {args.cluster} --batch {args.batch}",
            expected="at most --batch training processes",
            fix=f"raise --batch to at least {shape.processes}, or advise on fewer processes")
    return None


def _json_path(args: argparse.Namespace) -> str | None:
    if args.json is None:
        return None
    parent = args.json.parent
    if args.json.is_dir() or not parent.is_dir() or not os.access(parent, os.W_OK):
        return format_error("--json cannot be written.", received=f"--json {args.json}",
                            expected="a file path in an existing, writable directory",
                            fix="--json advice.json (or create the directory first)")
    return None


def _import(location: str) -> Any:
    """The module at ``location``; a script is checked import-safe first (`script_check`) and
    imported under its file's name, with ``sys.argv`` its own name alone, not the advisor's."""
    if not location.endswith(".py"):
        return importlib.import_module(location)
    path = Path(location).resolve()
    check_import_safe(path)
    sys.path.insert(0, str(path.parent))  # the script's own imports (e.g. `import common`)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    argv, sys.argv = sys.argv, [str(path)]
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except SystemExit as err:  # main code the check could not see (e.g. in a helper it calls)
        raise AdviseError(format_error(
            f"Importing {location} exited (status {err.code}): it runs its main code when "
            "imported.", received=location, expected="a script that only defines when imported",
            fix='move its main code under `if __name__ == "__main__":`')) from None
    finally:
        sys.argv = argv
    return module


@contextlib.contextmanager
def _progress(what: str, every: float = 15.0) -> Iterator[None]:
    """Says on stderr that ``what`` started, how long it has run every ``every`` s, and when
    it ended."""
    started = time.monotonic()
    done = threading.Event()

    def report() -> None:
        while not done.wait(every):
            _say(f"{what}: {time.monotonic() - started:.0f} s so far")

    _say(f"{what}...")
    ticker = threading.Thread(target=report, name="tfdist-advise-progress", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
    _say(f"{what}: done in {time.monotonic() - started:.1f} s")


def _say(message: str) -> None:
    print(f"[tfdist-advise] {message}", file=sys.stderr, flush=True)


def load_target(target: str, kwargs: dict[str, Any]) -> Any:
    """A zero-argument function building the model named by ``target`` with ``kwargs``.

    Raises:
        AdviseError: the module or function cannot be found, or the script runs its main code
            when imported (`tfdist.advise.script_check`).
    """
    location, _, name = target.rpartition(":")
    try:
        fn = getattr(_import(location), name)
    except AdviseError:
        raise
    except (ImportError, AttributeError, OSError, ValueError) as err:
        raise AdviseError(format_error(
            f"Cannot load the build function {target!r}: {err}.", received=target,
            expected="'path/to/script.py:function' or 'package.module:function'",
            fix="name a function that returns a built Keras model")) from err
    if "keras" in inspect.signature(fn).parameters and "keras" not in kwargs:
        from tfdist.core import flavour

        kwargs = {"keras": flavour.get_keras(), **kwargs}
    return lambda: fn(**kwargs)


def _constants_source(args: argparse.Namespace) -> str:
    """Where the network constants come from: the file given, the cache, or a probe."""
    return args.constants or (f"cache {network.default_path()}" if network.default_path().exists()
                              else "a new 2-process probe (a minute or two)")


def _dry_run(args: argparse.Namespace) -> int:
    shape = as_cluster(_cluster_value(args.cluster), args.device_memory)
    source = _constants_source(args)
    print(json.dumps({"target": args.target, "kwargs": args.kwargs, "batch": args.batch,
                      "cluster": vars(shape) | {"host_names": list(shape.host_names)},
                      "constants": source,
                      "candidates": [c.label for c in candidates(
                          shape, args.batch, args.micro_batches, args.max_ps, args.backends)],
                      "tensor": "layouts split T ways are added once the model is built: T "
                      "dividing its attention heads and a host's processes, where a registered "
                      "strategy takes --tensor"},
                     indent=1))
    return 0


def _run(args: argparse.Namespace) -> int:
    shape = as_cluster(_cluster_value(args.cluster), args.device_memory)
    if args.probe_only:
        measured = network.probe(backends=args.backends)
        path = network.save(measured, args.constants or network.default_path())
        print(f"[tfdist-advise] wrote {path}")
        return 0
    build = load_target(args.target, args.kwargs)  # a script that is not import-safe: now
    with _progress(f"network constants from {_constants_source(args)}"):
        constants = get_constants(shape, args.constants, args.backends)
    if args.measure_cores:
        with _progress("measuring the cores the processes get (--measure-cores)"):
            shape = dataclasses.replace(shape, cores=usable_cores(min(shape.per_host,
                                                                      os.cpu_count() or 1)))
    with _progress(f"profiling {args.target} at batch {args.batch} and ranking the layouts"):
        advice = advise(build, shape, batch=args.batch, constants=constants, script=args.script,
                        micro_batches=args.micro_batches, max_ps=args.max_ps,
                        backends=args.backends)
    print(report.render(advice))
    if args.json:
        args.json.write_text(json.dumps(report.to_json(advice), indent=1) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return _dry_run(args) if args.dry_run else _run(args)
    except TfdistError as err:
        print(f"tfdist-advise: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
