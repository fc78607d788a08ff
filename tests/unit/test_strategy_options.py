"""Option validation: every bad value raises StrategyConfigError naming the option and the fix.

Options are checked before the Keras flavour and TF_CONFIG, so these run in any test process.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

import tfdist.strategies
from tfdist.errors import StrategyConfigError
from tfdist.strategies.multi_worker import communication_options
from tfdist.strategies.parameter_server import make_partitioner

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("name", "options", "expected"),
    [
        ("multi_worker", {"implementation": "rnig"},
         "Invalid value for option 'implementation'. Received: implementation='rnig'. "
         "Expected: one of 'auto', 'ring', 'nccl'."),
        ("multi_worker", {"bytes_per_pack": -1},
         "Received: bytes_per_pack=-1. Expected: an int >= 1"),
        ("multi_worker", {"timeout_seconds": 0},
         "Received: timeout_seconds=0. Expected: a number > 0"),
        ("multi_worker", {"startup_timeout_seconds": "5"}, "Received: startup_timeout_seconds='5'"),
        ("parameter_server", {"num_shards": 0}, "Received: num_shards=0. Expected: an int >= 1"),
        ("parameter_server", {"min_shard_bytes": 1.5}, "Received: min_shard_bytes=1.5"),
        ("parameter_server", {"num_shards": 2, "min_shard_bytes": 1024},
         "Options that choose a variable partitioner exclude each other. Received: num_shards, "
         "min_shard_bytes"),
        ("parameter_server", {"variable_partitioner": "fixed"},
         "Invalid value for option 'variable_partitioner'"),
        ("mirrored", {"cross_device_ops": "ring"},
         "Received: cross_device_ops='ring'. Expected: one of 'nccl', 'hierarchical_copy', "
         "'reduce_to_one'."),
        ("mirrored", {"devices": "/cpu:0"},
         "Invalid value for option 'devices'. Received: devices='/cpu:0'. Expected: a non-empty "
         "list of device strings"),
        ("mirrored", {"devices": []}, "Received: devices=[]"),
        ("default", {"device": 0}, "Invalid value for option 'device'. Received: device=0."),
    ],
)
def test_bad_option_values(name, options, expected):
    with pytest.raises(StrategyConfigError) as info:
        tfdist.strategies.get_strategy(name, **options)
    assert expected in str(info.value)
    assert "Fix: " in str(info.value)


@pytest.mark.parametrize(
    ("implementation", "tf_value"),
    [("ring", "RING"), ("nccl", "NCCL"), ("auto", "AUTO")],
)
def test_communication_options_are_passed_through(implementation, tf_value):
    options = communication_options(implementation, bytes_per_pack=1 << 20, timeout_seconds=30)
    assert options.implementation == getattr(
        tf.distribute.experimental.CommunicationImplementation, tf_value
    )
    assert (options.bytes_per_pack, options.timeout_seconds) == (1 << 20, 30.0)


def test_partitioners():
    fixed = make_partitioner(num_ps=2, num_shards=3)
    assert isinstance(fixed, tf.distribute.experimental.partitioners.FixedShardsPartitioner)
    assert fixed(tf.TensorShape([10, 4]), tf.float32) == [3, 1]
    by_size = make_partitioner(num_ps=2, min_shard_bytes=64)
    assert isinstance(by_size, tf.distribute.experimental.partitioners.MinSizePartitioner)
    # 100x4 float32 = 1600 bytes: at most one shard per ps, so 2 (not 25).
    assert by_size(tf.TensorShape([100, 4]), tf.float32) == [2, 1]
    assert make_partitioner(num_ps=2) is None


def test_mirrored_options_reach_tensorflow():
    strategy = tfdist.strategies.get_strategy(
        "mirrored", devices=["/cpu:0"], cross_device_ops="reduce_to_one"
    )
    assert isinstance(strategy.extended._cross_device_ops, tf.distribute.ReductionToOneDevice)
    assert strategy.extended.worker_devices == ("/job:localhost/replica:0/task:0/device:CPU:0",)


def test_startup_deadline_defaults_to_600_s_and_env_can_change_or_disable_it(monkeypatch):
    from tfdist.strategies.startup import resolve_startup_timeout

    monkeypatch.delenv("TFDIST_STARTUP_TIMEOUT", raising=False)
    assert resolve_startup_timeout(None) == 600.0
    assert resolve_startup_timeout(5) == 5
    monkeypatch.setenv("TFDIST_STARTUP_TIMEOUT", "42")
    assert resolve_startup_timeout(None) == 42.0
    monkeypatch.setenv("TFDIST_STARTUP_TIMEOUT", "none")
    assert resolve_startup_timeout(None) is None
    monkeypatch.setenv("TFDIST_STARTUP_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="TFDIST_STARTUP_TIMEOUT is not a number of seconds"):
        resolve_startup_timeout(None)


@pytest.mark.slow  # seconds of training, a TF process or waiting: make test, not test-fast
def test_a_startup_hang_prints_who_joined_then_stops_naming_the_missing_peer(tmp_path):
    """Before: ten silent minutes. Now: progress every few seconds, then a clear stop."""
    import socket
    import subprocess
    import sys

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        up = f"127.0.0.1:{listening.getsockname()[1]}"
        code = (
            "import time\n"
            "from tfdist.cluster import ClusterSpec, Task\n"
            "from tfdist.strategies.startup import startup_deadline\n"
            f"spec = ClusterSpec(worker=['127.0.0.1:1', {up!r}, '127.0.0.1:9'])\n"
            "with startup_deadline(3, spec, Task('worker', 0), 'MultiWorkerMirroredStrategy'):\n"
            "    time.sleep(30)\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60)
    assert out.returncode == -9
    progress = [line for line in out.stderr.splitlines() if "waiting for its cluster" in line]
    assert len(progress) >= 2
    assert progress[0].startswith("tfdist: worker:0 waiting for its cluster (1 of 3 s)")
    assert progress[0].endswith("joined: worker:1; not yet: worker:2")
    assert "did not join its cluster within 3 s" in out.stderr
    assert "no answer from: worker:2" in out.stderr


def test_launcher_passes_startup_timeout_to_every_task():
    from tfdist.launcher.plan import JobOptions, plan_job

    plan = plan_job(JobOptions("t.py", workers=2, startup_timeout=45))
    assert plan.env["TFDIST_STARTUP_TIMEOUT"] == "45"
    assert "TFDIST_STARTUP_TIMEOUT" not in plan_job(JobOptions("t.py", workers=2)).env
