"""One process of a 2-stage pipeline job training KerasHub models built from small configs (no
download), whose backbones leave the sequence length out of ``keras.Input``: the cut carries a
hidden state of shape ``(None, hidden)`` and the padding mask, and the stages agree on each
batch's length with the transfer (`tfdist.pipeline.transport`).

Args: ``micro_batches MODEL [MODEL ...] [--then-sabotage] [--then-skip-row-reduce]
[--skip-row-reduce] [--one-length]``, MODEL one of `MODELS` (a model
the pipeline refuses reports the refusal: KerasHub 0.32's Llama decoder cannot give its
config, which each stage rebuilds from). For each
model every process builds it with a fixed seed, takes its stage (`build_model`), fits a
dataset of `BATCHES` global batches whose sequence lengths alternate between `LENGTHS` (bucketed
text: Adam, a padding mask with padded positions, the mask as sample weights) and reports the
gathered weights' gap to one process training the whole model on the same batches from the
same initial weights (the chief computes it), the losses, and its predictions on a batch of
each length (shared by the last stage with every stage) against the one-process model's.
``--then-sabotage`` trains the first model again with the gradient of the hidden state across
the cut dropped (zeros sent back instead): parity must fail. ``--then-skip-row-reduce`` (K x T)
trains it again with a block's row all-reduce skipped in each stage; ``--skip-row-reduce``
trains only that (the job's only model).
"""

from __future__ import annotations

import sys
import time

import keras
import numpy as np
import tensorflow as tf

import tfdist
from tfdist.errors import StrategyConfigError
from tfdist.testing import exit_after_report, report

GLOBAL, VOCAB, LR = 4, 64, 0.01
LENGTHS = (6, 10)
"""Two buckets of sequence lengths, both below the position embedding's maximum."""
BATCHES = 3


def build(name):
    import keras_hub

    models = keras_hub.models
    small = {"vocabulary_size": VOCAB, "num_layers": 2, "hidden_dim": 32}
    if name == "gpt2":
        backbone = models.GPT2Backbone(**small, num_heads=2, intermediate_dim=64,
                                       max_sequence_length=16, dropout=0.0)
        return models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    if name == "gemma":
        backbone = models.GemmaBackbone(**small, num_query_heads=2, num_key_value_heads=1,
                                        intermediate_dim=128, head_dim=16)
        return models.GemmaCausalLM(backbone=backbone, preprocessor=None)
    if name == "llama":  # KerasHub 0.32: its decoder's get_config fails (refused up front)
        backbone = models.LlamaBackbone(**small, num_query_heads=2, num_key_value_heads=1,
                                        intermediate_dim=64)
        return models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    if name == "bert":
        backbone = models.BertBackbone(**small, num_heads=2, intermediate_dim=64,
                                       max_sequence_length=16, dropout=0.0)
        return models.BertTextClassifier(backbone=backbone, num_classes=2, preprocessor=None,
                                         dropout=0.0)
    raise ValueError(name)


MODELS = ("gpt2", "gemma", "bert", "llama")


def batches(name):
    """`BATCHES` global batches, lengths alternating over `LENGTHS`, every other sequence padded
    at its end; next-token targets (BERT: a label and a weight per sequence)."""
    rng = np.random.default_rng(7)
    out = []
    for b in range(BATCHES):
        length = LENGTHS[b % len(LENGTHS)]
        tokens = rng.integers(1, VOCAB, size=(GLOBAL, length + 1)).astype("int32")
        mask = np.ones((GLOBAL, length), "int32")
        mask[1::2, -2:] = 0
        x = {"token_ids": tokens[:, :-1], "padding_mask": mask}
        if name == "bert":
            x["segment_ids"] = np.zeros_like(mask)
            out.append((x, tokens[:, 0] % 2, np.linspace(0.5, 1.5, GLOBAL).astype("float32")))
        else:
            out.append((x, tokens[:, 1:], mask.astype("float32")))
    return out


def dataset(name):
    """The batches one after another (their sequence axis None in the element spec)."""
    parts = [tf.data.Dataset.from_tensors(batch) for batch in batches(name)]
    data = parts[0]
    for part in parts[1:]:
        data = data.concatenate(part)
    return data


def fit(model, name, eagerly=False):
    model.compile(optimizer=keras.optimizers.Adam(LR), run_eagerly=eagerly,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(dataset(name), epochs=1, shuffle=False, verbose=0)
    return history.history["loss"]


def drop_cut_gradients():
    """The sabotage: every gradient sent back across a cut is zeros."""
    from tfdist.pipeline import engine, transport

    send = transport.send_boundary

    def dropping(link, tensors, boundary, kind, *args, **kwargs):
        if kind == transport.GRADIENT:
            tensors = [None if t is None else tf.zeros_like(t) for t in tensors]
        return send(link, tensors, boundary, kind, *args, **kwargs)

    engine.send_boundary = dropping


def skip_one_row_reduce():
    """The K x T sabotage: the first row-split layer inside a block each stage shards skips
    its all-reduce (each shard keeps its partial sum; its bias added on every shard)."""
    from tfdist.tensor import inplace, stages

    shard = stages.StageSplit.shard_blocks

    def unreduced(layer):
        equation = getattr(layer, "equation", None)

        def call(inputs, training=None):
            x = keras.ops.matmul(inputs, layer.kernel) if equation is None else \
                keras.ops.einsum(equation, inputs, layer.kernel)
            x = x if layer.bias is None else x + layer.bias
            return x if layer.activation is None else layer.activation(x)

        layer.call = call

    def sabotaged(self, model, spec, layer_ids):
        shard(self, model, spec, layer_ids)
        names = {spec.layers[lid].name for lid in layer_ids}
        rows = [layer.name for layer in self.plan.layers
                if layer.kind == "row" and layer.name.split("/")[0] in names]
        if rows:
            unreduced(inplace.layer_at(model, rows[0]))

    stages.StageSplit.shard_blocks = sabotaged


def gap(a, b):
    return max(float(np.max(np.abs(np.subtract(x, y)))) for x, y in zip(a, b, strict=True))


REFERENCES: dict[str, list] = {}
"""The chief's one-process weights per model (trained once; the sabotage is compared to them)."""


def ordered(model):
    """A whole model's weights in the order `gather_weights` gives them (its flattened graph's
    layers in order of first call)."""
    from tfdist.pipeline.graph import read_graph

    return [w for layer in read_graph(model).layers for w in getattr(layer, "get_weights",
                                                                     list)()]


def train_one(strategy, name, predict=True):
    """Trains model ``name`` under ``strategy``; its report. ``predict=False`` (a sabotage,
    checked on its weights alone) leaves out the predictions and their traced functions."""
    started = time.monotonic()
    keras.utils.set_random_seed(1)
    whole = build(name)
    initial = ordered(whole)
    model = strategy.build_model(whole)
    loss = fit(model, name)
    result = {"loss": loss, "seconds": time.monotonic() - started}
    if strategy.shards > 1:  # K x T: what this process holds, and the stages' plan
        result.update(held_bytes=strategy.stage_report()["param_bytes"],
                      stage=strategy.layout.stage, replica=strategy.layout.coordinates.data,
                      shard=strategy.layout.coordinates.tensor, plan=strategy.plan.as_dict(),
                      weight_bytes=int(sum(np.asarray(w).nbytes for w in model.get_weights())))
    trained = strategy.gather_weights(model)
    samples = [x for x, _, _ in batches(name)[:len(LENGTHS)]]  # one batch of each length
    if predict:
        predicted = [model.predict(x, batch_size=GLOBAL, verbose=0) for x in samples]
        result["predicted_shapes"] = [list(p.shape) for p in predicted]
        result["predicted_sum"] = [float(np.sum(p)) for p in predicted]
    if strategy.is_chief:
        result["moved"] = gap(trained, initial)
        if name not in REFERENCES:
            result["reference_loss"] = fit(whole, name, eagerly=True)
            REFERENCES[name] = ordered(whole)
        result["gap"] = gap(trained, REFERENCES[name])
        if predict and "reference_loss" in result:  # the whole model holds the reference's
            result["predict_gap"] = gap(predicted, [whole.predict(x, batch_size=GLOBAL,
                                                                  verbose=0) for x in samples])
    return result


def main(argv):
    global LENGTHS
    if "--one-length" in argv:
        LENGTHS = LENGTHS[:1]
    micro_batches = int(argv[0])
    names = [a for a in argv[1:] if a in MODELS]
    strategy = tfdist.get_strategy("auto", micro_batches=micro_batches, schedule="1f1b")
    result = {"stages": strategy.stages, "models": {}}
    if "--skip-row-reduce" in argv:  # the sabotage alone: the job's only model
        skip_one_row_reduce()
        result["sabotage"] = train_one(strategy, names[0], predict=False)
        names = []
    for name in names:
        try:
            result["models"][name] = train_one(strategy, name)
        except StrategyConfigError as err:
            result["models"][name] = {"refused": str(err)}
    if "--then-sabotage" in argv:
        drop_cut_gradients()
        result["sabotage"] = train_one(strategy, names[0], predict=False)
    if "--then-skip-row-reduce" in argv:
        skip_one_row_reduce()
        result["sabotage"] = train_one(strategy, names[0], predict=False)
    report(result)


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_after_report()
