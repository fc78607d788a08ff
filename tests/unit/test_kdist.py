"""``keras.distribution`` on TensorFlow (`tfdist.kdist`), in one process: the job, the mesh, the
LayoutMap as the tensor engine's splits, and every refusal, before anything trains.

The launched runs (2 processes, weights against one process) are
``tests/multiprocess/test_keras_distribution.py``.
"""

from __future__ import annotations

import socket

import keras
import numpy as np
import pytest

from tfdist.errors import StrategyConfigError
from tfdist.kdist import backend, job, layout
from tfdist.kdist.mesh import job_mesh, model_axis_of

pytestmark = pytest.mark.unit

DEVICES4 = ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]


# ----------------------------------------------------------------------------- job
def test_the_job_is_tf_configs_training_tasks_in_rank_order():
    env = {"TF_CONFIG": '{"cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"], '
                        '"ps": ["p:1"]}, "task": {"type": "worker", "index": 1}}'}
    found = job.job_of(env)
    assert (found.addresses, found.process_id, found.coordinator) == (("c:1", "w:1", "w:2"), 2,
                                                                       "c:1")
    assert job.device_names(found, "cpu") == ["cpu:0", "cpu:1", "cpu:2"]


def test_initialize_arguments_that_disagree_with_the_launched_job_are_refused():
    launched = job.Job(("h:1", "h:2"), 1)
    job.check_arguments(launched, ("h:1",), 2, 1)  # the coordinator alone, as JAX takes it
    with pytest.raises(StrategyConfigError, match=r"num_processes=4.*Expected: 2"):
        job.check_arguments(launched, (), 4, None)
    with pytest.raises(StrategyConfigError, match=r"process_id=0.*Expected: 1"):
        job.check_arguments(launched, (), None, 0)
    with pytest.raises(StrategyConfigError, match="job_addresses=h:9"):
        job.check_arguments(launched, ("h:9",), None, None)


def test_outside_a_launched_job_every_address_is_needed():
    with pytest.raises(StrategyConfigError, match="every process's address"):
        job.unlaunched_job(("h:1",), 2, 1)
    with pytest.raises(StrategyConfigError, match="needs the whole job"):
        job.unlaunched_job(("h:1", "h:2"), 2, None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def test_initialize_pointing_at_no_coordinator_fails_after_the_deadline(monkeypatch):
    """keras.distribution.initialize itself, outside a launched job: it writes TF_CONFIG, waits
    the start-up deadline for the coordinator, then names what it tried."""
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setenv("TF_CONFIG", "")
    monkeypatch.setenv("TFDIST_STARTUP_TIMEOUT", "1")
    monkeypatch.setattr(backend.state, "job", None)
    addresses = f"localhost:{_free_port()},localhost:{_free_port()}"
    with pytest.raises(StrategyConfigError) as raised:
        keras.distribution.initialize(addresses, num_processes=2, process_id=1)
    message = str(raised.value)
    assert f"no coordinator answered at {addresses.split(',')[0]} within 1 s" in message
    assert "attempt(s); last: ConnectionRefusedError" in message and "TFDIST_STARTUP_TIMEOUT" \
        in message
    assert backend.num_processes() == 2 and backend.process_id() == 1  # what it joined


def test_list_devices_is_one_device_per_process():
    assert keras.distribution.list_devices() == ["cpu:0"]
    assert keras.distribution.get_device_count() == 1


# ----------------------------------------------------------------------------- mesh
def test_a_data_by_model_mesh_is_the_process_mesh():
    mesh = job_mesh((2, 2), ("batch", "model"), DEVICES4, DEVICES4, "batch")
    assert (mesh.data, mesh.tensor) == (2, 2)
    assert job_mesh((1, 4), ("batch", "model"), DEVICES4, DEVICES4, "batch").tensor == 4
    assert job_mesh((2, 2), ("batch", "model"), DEVICES4, DEVICES4, None).data == 4


def test_a_mesh_of_another_size_than_the_job_is_refused_with_the_fix():
    with pytest.raises(StrategyConfigError) as raised:
        job_mesh((2, 4), ("batch", "model"), [f"cpu:{i}" for i in range(8)], DEVICES4, "batch")
    assert "The DeviceMesh has 8 devices; the job has 4 process(es)" in str(raised.value)
    assert "tfdist-launch --workers 8" in str(raised.value)


def test_axis_names_other_than_model_parallels_are_refused():
    with pytest.raises(StrategyConfigError, match=r"batch_dim_name='data', axis_names=\("
                                                  r"'batch', 'model'\)"):
        model_axis_of(("batch", "model"), "data")
    with pytest.raises(StrategyConfigError, match="at most two axes"):
        model_axis_of(("batch", "seq", "model"), "batch")
    with pytest.raises(StrategyConfigError, match="not in the job's rank order"):
        job_mesh((2, 2), ("model", "batch"), DEVICES4, DEVICES4, "batch")


def test_set_distribution_refuses_a_mesh_larger_than_the_job():
    mesh = keras.distribution.DeviceMesh((2,), ["batch"], devices=["cpu:0", "cpu:1"])
    with pytest.raises(StrategyConfigError, match="has 2 devices; the job has 1 process"):
        keras.distribution.set_distribution(keras.distribution.DataParallel(device_mesh=mesh))
    assert keras.distribution.distribution() is None


# ----------------------------------------------------------------------------- layout
class Block(keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.attention = keras.layers.MultiHeadAttention(2, 4, name="attention")
        self.up = keras.layers.Dense(16, activation="relu", name="up")
        self.down = keras.layers.Dense(8, name="down")

    def call(self, x):
        return x + self.down(self.up(x + self.attention(x, x)))


def transformer():
    tokens = keras.Input((3,), dtype="int32")
    x = Block(name="block")(keras.layers.Embedding(8, 8, name="emb")(tokens))
    return keras.Model(tokens, keras.layers.Dense(8, name="logits")(x))


def layout_map(entries, shape=(1, 2)):
    mesh = keras.distribution.DeviceMesh(shape, ["batch", "model"],
                                         [f"cpu:{i}" for i in range(int(np.prod(shape)))])
    result = keras.distribution.LayoutMap(mesh)
    for key, axes in entries.items():
        result[key] = axes
    return result


TRANSFORMER = {
    "emb/embeddings": ("model", None),
    "block/attention/(query|key|value)/kernel": (None, "model", None),
    "block/attention/attention_output/kernel": ("model", None, None),
    "block/up/kernel": (None, "model"), "block/up/bias": ("model",),
    "block/down/kernel": ("model", None),
    "logits/output": ("batch", None, None),
}


def kinds(result):
    return {entry.name: entry.kind for entry in result.plan.layers}


def test_a_hand_written_layout_map_drives_the_engines_splits():
    result = layout.plan_from_layout(transformer(), layout_map(TRANSFORMER), "model", "batch", 2)
    assert kinds(result) == {
        "emb": "vocab", "block/attention/query": "column", "block/attention/key": "column",
        "block/attention/value": "column", "block/attention/attention_output": "row",
        "block/up": "column", "block/down": "row", "logits": "replicated"}
    biases = {w.name: w.axis for e in result.plan.layers for w in e.weights if "bias" in w.name}
    assert biases["block/attention/query/bias"] == 0  # unnamed: follows its attention
    assert biases["block/down/bias"] is None
    assert any("an activation layout, a hint only" in note for note in result.notes)


def test_a_layout_map_that_shards_nothing_keeps_the_model_whole():
    result = layout.plan_from_layout(transformer(), layout_map({"logits/output": ("batch", None,
                                                                                  None)}),
                                     "model", "batch", 2)
    assert set(kinds(result).values()) == {"replicated"}


def test_an_entry_matching_no_variable_is_refused():
    with pytest.raises(StrategyConfigError) as raised:
        layout.plan_from_layout(transformer(), layout_map({**TRANSFORMER,
                                                           "block/ffn/kernel": (None, "model")}),
                                "model", "batch", 2)
    assert "LayoutMap entry 'block/ffn/kernel' matches no variable" in str(raised.value)


def test_a_sharding_no_split_implements_is_refused_with_the_nearest_layout():
    entries = {**TRANSFORMER, "block/up/kernel": ("model", None)}
    with pytest.raises(StrategyConfigError) as raised:
        layout.plan_from_layout(transformer(), layout_map(entries), "model", "batch", 2)
    message = str(raised.value)
    assert "shards variable 'block/up/kernel' (Dense block/up, shape (8, 16)) on dimension 0" \
        in message
    assert "Received: layout_map['block/up/kernel'] = ('model', None)" in message
    assert "Fix: layout_map['block/up/kernel'] = (None, 'model')" in message


def test_a_layout_of_the_wrong_rank_is_refused():
    with pytest.raises(StrategyConfigError, match=r"\('model',\) for shape \(8, 16\)"):
        layout.plan_from_layout(transformer(), layout_map({**TRANSFORMER,
                                                           "block/up/kernel": ("model",)}),
                                "model", "batch", 2)


def mlp():
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, activation="relu", name="d1")(inputs)
    return keras.Model(inputs, keras.layers.Dense(2, name="d2")(hidden))


def test_the_guides_mlp_layout_splits_a_top_level_dense_pair():
    entries = {"d1/kernel": (None, "model"), "d1/bias": ("model",),
               "d2/kernel": ("model", None), "d2/output": ("batch", None)}
    assert kinds(layout.plan_from_layout(mlp(), layout_map(entries), "model", "batch", 2)) == \
        {"d1": "column", "d2": "row"}


def test_a_column_dense_whose_reader_is_whole_is_refused_with_the_row_layout():
    with pytest.raises(StrategyConfigError) as raised:
        layout.plan_from_layout(mlp(), layout_map({"d1/kernel": (None, "model")}), "model",
                                "batch", 2)
    assert "Fix: layout_map['d2/kernel'] = ('model', None)" in str(raised.value)


def test_kerashubs_llama_recipe_splits_q_k_v_by_hidden_units():
    keras_hub = pytest.importorskip("keras_hub")
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=16, num_layers=1, num_query_heads=4, num_key_value_heads=2, hidden_dim=8,
        intermediate_dim=16)
    devices = [f"cpu:{i}" for i in range(4)]
    mesh = keras.distribution.DeviceMesh((2, 2), ["batch", "model"], devices)
    result = layout.plan_from_layout(
        backbone, keras_hub.models.LlamaBackbone.get_layout_map(mesh), "model", "batch", 2, 2)
    found = kinds(result)
    block = "transformer_layer_0/"
    assert [found[f"{block}self_attention/{p}"] for p in ("query", "key", "value",
                                                          "attention_output")] == \
        ["hidden", "hidden", "hidden", "row"]
    assert found[f"{block}feedforward_gate_dense"] == "column"
    assert found["token_embedding"] == "vocab"
    axes = {w.name: w.axis for e in result.plan.layers for w in e.weights}
    assert axes[f"{block}self_attention/query/kernel"] == 0
    assert result.plan.split_bytes >= 0.95 * result.plan.whole_bytes
    assert any("held whole on each of the 2 data replicas" in n for n in result.notes)


def test_under_model_parallel_fit_refuses_a_bad_layout_before_training():
    """The whole path in one process: created under the distribution, compiled, fit refuses."""
    mesh = keras.distribution.DeviceMesh((1, 1), ["batch", "model"], ["cpu:0"])
    lmap = keras.distribution.LayoutMap(mesh)
    lmap["d9/kernel"] = (None, "model")
    distribution = keras.distribution.ModelParallel(layout_map=lmap, batch_dim_name="batch")
    with distribution.scope():
        model = mlp()
    model.compile(optimizer="sgd", loss="mse")
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(StrategyConfigError, match="'d9/kernel' matches no variable"):
        model.fit(np.ones((4, 4), "float32"), np.ones((4, 2), "float32"), verbose=0)
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))


def test_importing_tfdist_installs_the_backend_functions_keras_lacks():
    from keras.src.backend.tensorflow import distribution_lib

    assert distribution_lib.initialize is backend.initialize
    assert distribution_lib.distribute_tensor is backend.distribute_tensor
    assert getattr(keras.distribution.set_distribution, "__tfdist__", False)


@pytest.mark.parametrize("name", ["tfdist.kdist.job", "tfdist.kdist.mesh", "tfdist.kdist.layout"])
def test_the_docstring_examples_run(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def llama_plan():
    keras_hub = pytest.importorskip("keras_hub")
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=16, num_layers=1, num_query_heads=4, num_key_value_heads=2, hidden_dim=8,
        intermediate_dim=16)
    mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"], ["cpu:0", "cpu:1"])
    return backbone, layout.plan_from_layout(
        backbone, keras_hub.models.LlamaBackbone.get_layout_map(mesh), "model", "batch", 2)


def test_the_hidden_split_gives_the_whole_blocks_outputs_and_gradients(monkeypatch):
    """The block check (T shards in this process, forward and backward) on Llama's hidden-unit
    q/k/v split; and skipping the split's all-reduces (sabotage) makes the check fail."""
    from threading import local

    from tfdist.parallel import mappings
    from tfdist.tensor import blocks, inplace
    from tfdist.tensor.check import TOLERANCE

    backbone, result = llama_plan()
    plan, _, gaps = blocks.checked_plan(backbone, result.plan, result.units)
    assert gaps and max(gaps.values()) <= TOLERANCE, gaps
    assert [e.kind for e in plan.layers if "self_attention/" in e.name] == \
        ["hidden", "hidden", "hidden", "row"]

    # The T shards run at once, each in a thread: the sabotage is one patch for the whole
    # test that skips the sum only inside a hidden-split layer's call (a patch set and undone
    # by each shard's thread raced: one thread restored the other's patch, and the module kept
    # it for the tests that came after).
    hidden, copy_to_group, inside = inplace._WRAPS["hidden"], mappings.copy_to_group, local()
    monkeypatch.setattr(mappings, "copy_to_group", lambda x, *rest: x if getattr(
        inside, "hidden", False) else copy_to_group(x, *rest))

    def skipping(layer, group, timeout):
        hidden(layer, group, timeout)
        call = layer.call

        def alone(inputs, training=None):
            inside.hidden = True
            try:
                return call(inputs, training)
            finally:
                inside.hidden = False

        layer.call = alone

    monkeypatch.setitem(inplace._WRAPS, "hidden", skipping)
    _, _, broken = blocks.checked_plan(backbone, result.plan, result.units)
    assert max(broken.values()) > 100 * TOLERANCE, broken
