"""Runs Horovod's own ``examples/tensorflow2`` scripts, unchanged, through ``tfdist-launch``.

Usage (``make horovod-examples HOROVOD_SRC=...`` runs this)::

    python launch/horovod_examples.py --horovod-src PATH [--scripts NAME ...] [--flavours ...]

PATH is a checkout of horovod/horovod at tag v0.28.1 (the sdist has no examples). Each script
runs as ``tfdist-launch --strategy horovod --workers 2 SCRIPT`` over Gloo (``RUNS`` adds
``--mpi`` for some), once per Keras flavour (``TF_USE_LEGACY_KERAS`` 0 or 1, which tfdist-launch
hands to the ranks). The scripts are not edited: ``launch/example_shim/sitecustomize.py``, put
first on ``PYTHONPATH``, caps their ``fit``/``take`` (24 epochs of MNIST would take hours here),
serves a generated ``mnist.npz`` instead of the download, and writes each rank's weights at exit.
A run passes when it exits 0 and both ranks hold identical trainable weights (atol 0) that
differ from the first ones (non-trainable ones, BatchNormalization's moving statistics, are each
rank's own under Horovod: they are counted, not required equal). Scripts that cannot run here
are in ``NOT_RUNNABLE``; a failure listed in ``KERAS2_ONLY`` is the script's own Keras 2 code
under Keras 3, and counts as expected only if its output shows that cause. The script prints a
markdown table; any other failure exits 1.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHIM = REPO / "launch" / "example_shim"
FLAVOURS = {"keras3": "0", "tf-keras": "1"}
PACKAGES = {"keras3": "keras", "tf-keras": "tf_keras"}
"""The package a flavour's models come from (what the shim records)."""
TIMEOUT_S = 600
SMALL_CNN = ("--model", "MobileNetV3Small", "--batch-size", "2", "--num-iters", "2",
             "--num-batches-per-iter", "2", "--no-cuda")
"""The synthetic benchmarks' own options, for a model that trains on 2 CPU cores (default
ResNet50 at batch 32)."""


@dataclass(frozen=True)
class Example:
    """One script of ``examples/tensorflow2`` and how it runs here."""

    args: tuple[str, ...] = ()
    controllers: tuple[str, ...] = ("gloo",)


RUNS = {
    "tensorflow2_keras_mnist.py": Example(controllers=("gloo", "mpi")),
    "tensorflow2_mnist.py": Example(controllers=("gloo", "mpi")),
    "tensorflow2_keras_synthetic_benchmark.py": Example(args=SMALL_CNN),
    "tensorflow2_synthetic_benchmark.py": Example(args=(*SMALL_CNN, "--num-warmup-batches", "1")),
}

NOT_RUNNABLE = {
    "tensorflow2_mnist_data_service.py":
        "trains from a tf.data service that a second Horovod job "
        "(`horovod.tensorflow.data.compute_worker`) starts and describes in a config file; "
        "tfdist-launch runs one job, in its own loopback-only network namespace, which a "
        "second job cannot reach",
    "tensorflow2_mnist_data_service_train_fn_compute_side_dispatcher.py":
        "a train_fn imported by tensorflow2_mnist_data_service.py, not a script",
    "tensorflow2_mnist_data_service_train_fn_training_side_dispatcher.py":
        "a train_fn imported by tensorflow2_mnist_data_service.py, not a script",
}

KERAS2_ONLY = {
    "tensorflow2_keras_mnist.py": (
        "compile(experimental_run_tf_function=False): Keras 3's compile has no such argument",
        "experimental_run_tf_function"),
    "tensorflow2_keras_synthetic_benchmark.py": (
        "compile(experimental_run_tf_function=False): Keras 3's compile has no such argument",
        "experimental_run_tf_function"),
    "tensorflow2_mnist.py": (
        "hvd.broadcast_variables(opt.variables()): Keras 3's optimizer.variables is a list",
        "'list' object is not callable"),
    "tensorflow2_synthetic_benchmark.py": (
        "hvd.broadcast_variables(opt.variables()): Keras 3's optimizer.variables is a list",
        "'list' object is not callable"),
}
"""Script -> (its Keras-2-only line, the text its failure under Keras 3 must show)."""


@dataclass
class Result:
    script: str
    flavour: str
    controller: str
    status: str  # pass, fail, keras2-only
    seconds: float
    identical: bool | None = None
    change: float | None = None
    local_differ: int | None = None
    detail: str = ""


def write_mnist(path: Path, train: int = 2048, test: int = 256, seed: int = 0) -> Path:
    """A deterministic, learnable stand-in for ``mnist.npz``: label k lights up column block k.

    Example:
        >>> import tempfile
        >>> with np.load(write_mnist(Path(tempfile.mkdtemp()) / "m.npz", 20, 10)) as f:
        ...     f["x_train"].shape, f["x_train"].dtype, f["y_test"].shape
        ((20, 28, 28), dtype('uint8'), (10,))
    """
    rng = np.random.default_rng(seed)

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        labels = rng.integers(0, 10, n).astype(np.uint8)
        images = rng.integers(0, 64, (n, 28, 28)).astype(np.uint8)
        for k in range(10):
            images[labels == k, 4:24, 2 + 2 * k:4 + 2 * k] = 255
        return images, labels

    (x_train, y_train), (x_test, y_test) = split(train), split(test)
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    return path


def launch_command(script: Path, example: Example, controller: str) -> list[str]:
    """The ``tfdist-launch`` command of one run (the script and its own arguments unchanged).

    ``--verbose``: every rank's lines, so that the cause of a failure shows whichever rank
    failed first.
    """
    mpi = ["--mpi"] if controller == "mpi" else []
    return [sys.executable, "-m", "tfdist.launcher.cli", "--strategy", "horovod", "--workers",
            "2", *mpi, "--verbose", "--timeout", str(TIMEOUT_S), str(script), *example.args]


def run_env(run_dir: Path, flavour: str, home: Path | None = None) -> dict[str, str]:
    """The launcher's environment: the shim first on PYTHONPATH, a private HOME (``home``, else
    the run's folder), the flavour."""
    path = os.pathsep.join(p for p in (str(SHIM), str(REPO), os.environ.get("PYTHONPATH")) if p)
    home = home or run_dir
    return dict(os.environ, PYTHONPATH=path, HOME=str(home), KERAS_HOME=str(home / ".keras"),
                TF_USE_LEGACY_KERAS=FLAVOURS[flavour], TF_CPP_MIN_LOG_LEVEL="2",
                TFDIST_EXAMPLE_OUT=str(run_dir),
                TFDIST_EXAMPLE_MNIST=str(write_mnist(run_dir / "mnist.npz")))


def _trainable(arrays: dict[str, np.ndarray], key: str) -> bool:
    model, index = key.split("/")[1:]
    return bool(arrays[f"trainable/{model}"][int(index)])


def compare_ranks(run_dir: Path, flavour: str) -> tuple[bool, float, int, str]:
    """Reads the weights the shim wrote for ranks 0 and 1.

    Returns (trainable weights identical across ranks, largest change of rank 0's trainable
    weights from their first values, non-trainable weights that differ across ranks, problem).
    Non-trainable weights (BatchNormalization's moving statistics) are each rank's own under
    Horovod: they follow that rank's batches and are not all-reduced.
    """
    files = [run_dir / f"rank-{r}.npz" for r in (0, 1)]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        return False, 0.0, 0, f"no weights written: {', '.join(missing)}"
    with np.load(files[0]) as a, np.load(files[1]) as b:
        rank0, rank1 = dict(a), dict(b)
    packages = {str(p) for r in (rank0, rank1) for p in r["keras"]}
    if packages != {PACKAGES[flavour]}:
        return False, 0.0, 0, f"asked for {flavour}, the models came from {sorted(packages)}"
    finals = sorted(k for k in rank0 if k.startswith("final/"))
    if not finals or finals != sorted(k for k in rank1 if k.startswith("final/")):
        return False, 0.0, 0, "the ranks wrote different sets of weights"
    trainable = [k for k in finals if _trainable(rank0, k)]
    identical = all(np.array_equal(rank0[k], rank1[k]) for k in trainable)
    local = sum(not np.array_equal(rank0[k], rank1[k]) for k in finals if k not in trainable)
    starts = [k for k in trainable if "init/" + k[len("final/"):] in rank0]
    if not starts:
        return identical, 0.0, local, "no first weights recorded"
    change = max(float(np.max(np.abs(rank0[k] - rank0["init/" + k[len("final/"):]]), initial=0))
                 for k in starts)
    return identical, change, local, ""


def first_error(output: str) -> str:
    """The first exception line a rank printed (horovodrun's and mpirun's own reports skipped).

    Example:
        >>> first_error("[1]<stderr>:ValueError: bad\\nRuntimeError: Horovod detected that ...")
        'ValueError: bad'
    """
    for line in output.splitlines():
        found = re.search(r"\b(\w+(?:Error|Exception)): .*", line)
        if found and "Horovod detected that" not in line:
            return found.group(0)
    return "no exception line"


def failure(script: str, flavour: str, code: int, output: str) -> tuple[str, str]:
    """(status, detail) of a run that exited ``code``: expected only for its listed cause.

    Example:
        >>> cause = "TypeError: 'list' object is not callable"
        >>> failure("tensorflow2_mnist.py", "keras3", 1, cause)[0]
        'keras2-only'
        >>> failure("tensorflow2_mnist.py", "tf-keras", 1, cause)[0]
        'fail'
    """
    expected = KERAS2_ONLY.get(script) if flavour == "keras3" else None
    if expected and expected[1] in output:
        return "keras2-only", expected[0]
    tail = "\n".join(output.splitlines()[-20:])
    return "fail", f"exit {code}: {first_error(output)}; last lines:\n{tail}"


def launch(command: list[str], run_dir: Path, env: dict[str, str]) -> tuple[str, int]:
    """Runs tfdist-launch (its own ``--timeout`` stops the job first); (output, exit status).

    A launcher still running a minute after its own timeout is killed with its process group.
    """
    process = subprocess.Popen(command, cwd=run_dir, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=TIMEOUT_S + 60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return output + f"\nkilled: still running {TIMEOUT_S + 60} s after the start", -1
    return output, process.returncode


def run_one(script: Path, example: Example, flavour: str, controller: str,
            home: Path | None = None) -> Result:
    """Runs ``script`` once through tfdist-launch, in a fresh directory; checks its ranks' weights.

    ``home``: the private HOME (and KERAS_HOME under it) of the run; None: the run's directory.
    Runs that share one (the tests) can share the test suite's warm server, which HOME picks.

    Example:
        >>> run_one(Path("train.py"), Example(), "tf-keras", "gloo")  # doctest: +SKIP
        Result(script='train.py', flavour='tf-keras', controller='gloo', status='pass', ...)
    """
    with tempfile.TemporaryDirectory(prefix="hvd-example-") as tmp:
        run_dir = Path(tmp)
        started = time.monotonic()
        output, code = launch(launch_command(script, example, controller), run_dir,
                              run_env(run_dir, flavour, home))
        result = Result(script.name, flavour, controller, "fail", time.monotonic() - started)
        if code != 0:
            result.status, result.detail = failure(script.name, flavour, code, output)
            return result
        (result.identical, result.change, result.local_differ,
         result.detail) = compare_ranks(run_dir, flavour)
        if result.identical and result.change > 0 and not result.detail:
            result.status = "pass"
        elif not result.detail:
            result.detail = "ranks differ" if not result.identical else "training changed nothing"
        return result


def report(results: list[Result]) -> str:
    """The markdown table of `results`, then the scripts that were not run and why."""
    rows = ["| script | Keras | controller | result | trainable weights identical | "
            "max change | non-trainable differing | s |",
            "| --- | --- | --- | --- | --- | ---: | ---: | ---: |"]
    for r in results:
        status = r.status if r.status == "pass" else f"{r.status}: {r.detail.splitlines()[0]}"
        identical = "-" if r.identical is None else ("yes" if r.identical else "NO")
        change = "-" if r.change is None else f"{r.change:.3g}"
        local = "-" if r.local_differ is None else str(r.local_differ)
        rows.append(f"| `{r.script}` | {r.flavour} | {r.controller} | {status} | {identical} | "
                    f"{change} | {local} | {r.seconds:.0f} |")
    rows += ["", "Not run:"] + [f"- `{name}`: {why}" for name, why in NOT_RUNNABLE.items()]
    for r in results:
        if r.status == "fail":
            rows += ["", f"{r.script} ({r.flavour}, {r.controller}): {r.detail}"]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--horovod-src", type=Path, required=True,
                        help="a checkout of horovod/horovod at tag v0.28.1")
    parser.add_argument("--scripts", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--flavours", nargs="+", default=list(FLAVOURS), choices=list(FLAVOURS))
    parser.add_argument("--controllers", nargs="+", default=["gloo", "mpi"],
                        choices=["gloo", "mpi"], help="runs a script only on those it lists")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    examples = args.horovod_src / "examples" / "tensorflow2"
    missing = [name for name in args.scripts if not (examples / name).is_file()]
    if missing:
        parser.error(f"--horovod-src {args.horovod_src}: {', '.join(missing)} not found under "
                     f"{examples}. Expected a checkout of horovod/horovod at tag v0.28.1 "
                     "(git clone --branch v0.28.1 <horovod repository>).")
    plan = [(s, f, c) for s in args.scripts for f in args.flavours
            for c in RUNS[s].controllers if c in args.controllers]
    if args.dry_run:
        for script, flavour, controller in plan:
            command = launch_command(examples / script, RUNS[script], controller)
            print(f"TF_USE_LEGACY_KERAS={FLAVOURS[flavour]} {' '.join(command)}")
        return 0
    results = []
    for script, flavour, controller in plan:
        print(f"[examples] {script} with {flavour} over {controller} ...", file=sys.stderr,
              flush=True)
        results.append(run_one(examples / script, RUNS[script], flavour, controller))
    print(report(results))
    return 1 if any(r.status == "fail" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
