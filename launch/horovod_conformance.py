"""Runs Horovod's own TensorFlow test files against tfdist's Horovod build, under both Keras.

Usage (``make horovod-conformance HOROVOD_SRC=...`` runs this)::

    python launch/horovod_conformance.py --horovod-src PATH [--files test_tensorflow.py ...]

PATH is a checkout of the horovod/horovod repository at the tag tfdist builds (v0.28.1): the PyPI
sdist does not ship the tests. Each file runs under ``horovodrun -np 2 --gloo`` once with Keras 3
and once with tf-keras (``TF_USE_LEGACY_KERAS``). The script prints a markdown table of passed,
failed and skipped tests per file and flavour, and lists every failure: a failure named in
``KERAS2_ONLY`` (the test's own code cannot run on Keras 3) is expected; any other failure makes the
exit status 1.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

FILES = ("test_tensorflow.py", "test_tensorflow2_keras.py", "test_tensorflow_keras.py")
FLAVOURS = {"keras3": "0", "tf-keras": "1"}
TIMEOUT_S = 1800

# Tests whose own code is Keras-2-only, with the line of theirs that cannot run on Keras 3.
KERAS2_ONLY = {
    "test_tensorflow.py::TensorFlowTests::test_horovod_syncbn_cpu":
        "builds its reference as BatchNormalization(fused=False): Keras 3 has no `fused`",
    "test_tensorflow.py::TensorFlowTests::test_partial_distributed_gradient_tape":
        "checks its result with var.ref(): Keras 3 variables have no ref()",
    "test_tensorflow2_keras.py::Tf2KerasTests::test_sparse_as_dense":
        "builds RMSprop(lr=...): Keras 3 has no `lr` argument",
    "test_tensorflow2_keras.py::Tf2KerasTests::test_sparse_as_dense_with_grad_aggregation":
        "builds RMSprop(lr=...): Keras 3 has no `lr` argument",
    "test_tensorflow2_keras.py::Tf2KerasTests::test_legacy_optimizer":
        "uses keras.optimizers.legacy, which Keras 3 removed",
    "test_tensorflow2_keras.py::Tf2KerasTests::test_train_model_lr_schedule":
        "uses keras.losses.mean_squared_error and layers.ThresholdedReLU, removed in Keras 3",
    "test_tensorflow2_keras.py::Tf2KerasTests::test_gradient_aggregation_0":
        "subclasses Optimizer without a learning_rate, which Keras 3 requires",
    "test_tensorflow2_keras.py::Tf2KerasTests::test_gradient_aggregation_1":
        "subclasses Optimizer without a learning_rate, which Keras 3 requires",
    "test_tensorflow2_keras.py::Tf2KerasTests::test_gradient_aggregation_with_local_vars_0":
        "subclasses Optimizer without a learning_rate, which Keras 3 requires",
    "test_tensorflow2_keras.py::Tf2KerasTests::test_gradient_aggregation_with_local_vars_1":
        "subclasses Optimizer without a learning_rate, which Keras 3 requires",
    "test_tensorflow2_keras.py::Tf2KerasTests::test_broadcast_global_variables_callback_with_local_vars":
        "checks its result with var.ref(): Keras 3 variables have no ref()",
    "test_tensorflow2_keras.py::Tf2KerasTests::test_partial_distributed_optimizer":
        "checks its result with var.ref() and model.loss(...): Keras 3 has neither",
}


@dataclass
class Result:
    file: str
    flavour: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)
    skip_reasons: dict[str, int] = field(default_factory=dict)
    error: str = ""

    def unexpected(self) -> list[str]:
        if self.flavour == "tf-keras":
            return list(self.failures)
        return [name for name in self.failures if name not in KERAS2_ONLY]


def run_file(test_dir: Path, name: str, flavour: str) -> Result:
    utils = os.pathsep.join([str(test_dir.parent / "utils"), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, TF_USE_LEGACY_KERAS=FLAVOURS[flavour], TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=utils)
    command = ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "-m",
               "pytest", "-q", "-rfEs", "--no-header", "-p", "no:cacheprovider", "--tb=no", name]
    try:
        done = subprocess.run(command, cwd=test_dir, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
        output = done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        return Result(name, flavour, error=f"timed out after {TIMEOUT_S} s ({expired.cmd[0]})")
    return parse_rank0(output, name, flavour)


def parse_rank0(output: str, name: str, flavour: str) -> Result:
    """Counts rank 0's summary: its lines are prefixed ``[0]<stdout>:`` by horovodrun."""
    lines = [line.split(":", 1)[1] for line in output.splitlines()
             if line.startswith("[0]<stdout>:")]
    result = Result(name, flavour)
    for line in lines:
        if line.startswith(("FAILED ", "ERROR ", "SUBFAILED")):  # SUBFAILED[mode] name
            name = line.split()[1]
            if name not in result.failures:
                result.failures.append(name)
        elif line.startswith("SKIPPED "):
            reason = re.sub(r"^SKIPPED \[\d+\] [^:]+:\d+: ", "", line).strip()
            result.skip_reasons[reason] = result.skip_reasons.get(reason, 0) + 1
    summary = next((line for line in reversed(lines)
                    if re.search(r"\d+ (passed|failed|skipped)", line)), "")
    for count, word in re.findall(r"(\d+) (passed|failed|skipped|error)", summary):
        key = "failed" if word == "error" else word
        setattr(result, key, getattr(result, key) + int(count))
    if not summary:
        tail = "\n".join(output.splitlines()[-15:])
        result.error = f"no pytest summary from rank 0; last lines:\n{tail}"
    return result


def report(results: list[Result]) -> str:
    rows = ["| file | Keras | passed | failed | skipped | failures not due to Keras-2-only tests |",
            "| --- | --- | ---: | ---: | ---: | --- |"]
    for r in results:
        rows.append(f"| `{r.file}` | {r.flavour} | {r.passed} | {r.failed} | {r.skipped} | "
                    f"{', '.join(r.unexpected()) or r.error or 'none'} |")
    skips: dict[str, int] = {}
    for r in results:
        for reason, count in r.skip_reasons.items():
            skips[reason] = skips.get(reason, 0) + count
    rows.append("")
    rows.append("Skip reasons (all files and flavours): " + "; ".join(
        f"{reason} ({count})" for reason, count in sorted(skips.items(), key=lambda kv: -kv[1])))
    expected = sorted({name for r in results if r.flavour == "keras3"
                       for name in r.failures if name in KERAS2_ONLY})
    if expected:
        rows.append("")
        rows.append("Keras-2-only test code (fails under Keras 3 by its own code, "
                    "passes under tf-keras):")
        rows.extend(f"- `{name.split('::')[-1]}`: {KERAS2_ONLY[name]}" for name in expected)
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--horovod-src", type=Path, required=True,
                        help="a checkout of horovod/horovod at tag v0.28.1")
    parser.add_argument("--files", nargs="+", default=list(FILES), choices=FILES)
    parser.add_argument("--flavours", nargs="+", default=list(FLAVOURS), choices=list(FLAVOURS))
    args = parser.parse_args(argv)
    test_dir = args.horovod_src / "test" / "parallel"
    missing = [name for name in args.files if not (test_dir / name).is_file()]
    if missing:
        parser.error(f"--horovod-src {args.horovod_src}: {', '.join(missing)} not found under "
                     f"{test_dir}. "
                     "Expected a checkout of horovod/horovod at tag v0.28.1 "
                     "(git clone --branch v0.28.1 <horovod repository>).")
    results = []
    for name in args.files:
        for flavour in args.flavours:
            print(f"[conformance] {name} with {flavour} ...", file=sys.stderr, flush=True)
            results.append(run_file(test_dir, name, flavour))
    print(report(results))
    return 1 if any(r.unexpected() or r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
