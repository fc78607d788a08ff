"""The conformance runner's reading of rank 0's pytest summary (launch/horovod_conformance.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "launch" / "horovod_conformance.py"
_SPEC = importlib.util.spec_from_file_location("horovod_conformance", SCRIPT)
conformance = importlib.util.module_from_spec(_SPEC)
sys.modules["horovod_conformance"] = conformance  # its dataclasses look their module up
_SPEC.loader.exec_module(conformance)

OUTPUT = """\
[1]<stdout>:FAILED test_tensorflow.py::TensorFlowTests::test_rank1_only - boom
[0]<stdout>:SKIPPED [1] test_tensorflow.py:57: No GPUs available
[0]<stdout>:SKIPPED [1] test_tensorflow.py:99: No GPUs available
[0]<stdout>:SUBFAILED[graph_mode] test_tensorflow.py::TensorFlowTests::test_horovod_syncbn_cpu
[0]<stdout>:SUBFAILED[eager_mode] test_tensorflow.py::TensorFlowTests::test_horovod_syncbn_cpu
[0]<stdout>:FAILED test_tensorflow.py::TensorFlowTests::test_new_bug - AttributeError
[0]<stdout>:3 failed, 143 passed, 2 skipped, 9 warnings in 142.10s (0:02:22)
"""


def test_rank0_summary_and_failures_are_read_and_keras2_only_tests_are_expected():
    result = conformance.parse_rank0(OUTPUT, "test_tensorflow.py", "keras3")
    assert (result.passed, result.failed, result.skipped) == (143, 3, 2)
    assert result.failures == ["test_tensorflow.py::TensorFlowTests::test_horovod_syncbn_cpu",
                               "test_tensorflow.py::TensorFlowTests::test_new_bug"]
    assert result.skip_reasons == {"No GPUs available": 2}
    assert result.unexpected() == ["test_tensorflow.py::TensorFlowTests::test_new_bug"]
    # Under tf-keras nothing is excused.
    tf_keras = conformance.parse_rank0(OUTPUT, "test_tensorflow.py", "tf-keras")
    assert len(tf_keras.unexpected()) == 2


def test_a_run_without_a_summary_is_an_error():
    result = conformance.parse_rank0("Traceback: horovodrun failed\n", "test_x.py", "keras3")
    assert result.error.startswith("no pytest summary from rank 0")
    assert "| `test_x.py` | keras3 | 0 | 0 | 0 | no pytest summary" in conformance.report([result])
