"""One process of a tensor-parallel job training KerasHub models built from small configs (no
download), each split inside its blocks (`tfdist.tensor.nested`), and what the test checks.

Args: ``steps MODEL [MODEL ...] [--global N] [--save FILE] [--then-from-function] [--then-sabotage]
[--then-skip-data-average]``, MODEL one of `MODELS`; ``--global``: rows of a global batch (4; at
D=2 an odd count gives the replicas 2 and 3 rows); ``--save``: the first model saved whole
(`save_model`) and reloaded by the chief; ``--then-from-function``: the first model built by
``build_model(fn)``, each process drawing with its own seed (the shards must be slices of rank 0's
draw). For each model: every process builds it with a fixed seed, takes its shard
(`TensorStrategy.build_model`: the whole tree planned, each block checked whole against split, the
split layers sliced in place), fits ``steps`` global batches of two sequence lengths (Adam, a
padding mask with padded positions, the mask as sample weights) and reports its gathered weights;
the chief also trains the whole model in one process on the same batches from the same initial
weights (the reference). ``--then-sabotage`` trains the first model again with every row-split
layer skipping its all-reduce across processes (the pre-training check, which sums in one process,
still sees them right), so parity must fail; ``--then-skip-data-average`` (D x T) trains it again
with each data replica keeping its own gradients (not averaged over the data axis): parity must
fail."""

from __future__ import annotations

import sys
import time

import keras
import numpy as np

import tfdist
from tfdist.testing import exit_after_report, report

GLOBAL, SEQ, VOCAB, LR = 4, 8, 128, 0.01


def build(name):
    import keras_hub

    models = keras_hub.models
    if name == "gpt2":
        backbone = models.GPT2Backbone(vocabulary_size=VOCAB, num_layers=2, num_heads=4,
                                       hidden_dim=64, intermediate_dim=256,
                                       max_sequence_length=SEQ, dropout=0.0)
        return models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    if name == "llama":
        backbone = models.LlamaBackbone(vocabulary_size=VOCAB, num_layers=2, num_query_heads=4,
                                        num_key_value_heads=2, hidden_dim=64,
                                        intermediate_dim=256)
        return models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    if name == "gemma":
        backbone = models.GemmaBackbone(vocabulary_size=VOCAB, num_layers=2, num_query_heads=4,
                                        num_key_value_heads=2, hidden_dim=64,
                                        intermediate_dim=512, head_dim=16)
        return models.GemmaCausalLM(backbone=backbone, preprocessor=None)
    if name == "bert":
        backbone = models.BertBackbone(vocabulary_size=VOCAB, num_layers=2, num_heads=4,
                                       hidden_dim=64, intermediate_dim=256,
                                       max_sequence_length=SEQ, dropout=0.0)
        return models.BertTextClassifier(backbone=backbone, num_classes=2, preprocessor=None,
                                         dropout=0.0)
    raise ValueError(name)


MODELS = ("gpt2", "llama", "gemma", "bert")


LENGTHS = (SEQ, SEQ - 3)
"""Sequence lengths the global batches alternate between (bucketed text): the train step is
traced once with the length left open, its collectives inside the blocks on sized keys."""


def data(steps, name):
    """``steps`` global batches, lengths alternating over `LENGTHS`, every other sequence
    padded at its end: next-token targets (a BERT classifier: a label and a weight per
    sequence), as one dataset (its sequence axis None in the element spec)."""
    import tensorflow as tf

    rng = np.random.default_rng(7)
    batches = []
    for step in range(steps):
        length = LENGTHS[step % len(LENGTHS)]
        tokens = rng.integers(0, VOCAB, size=(GLOBAL, length + 1)).astype("int32")
        mask = np.ones((GLOBAL, length), "int32")
        mask[1::2, -3:] = 0
        x = {"token_ids": tokens[:, :-1], "padding_mask": mask}
        if name == "bert":
            x["segment_ids"] = np.zeros_like(mask)
            batch = (x, tokens[:, 0] % 2, np.linspace(0.5, 1.5, GLOBAL).astype("float32"))
        else:
            batch = (x, tokens[:, 1:], mask.astype("float32"))
        batches.append(tf.data.Dataset.from_tensors(batch))
    dataset = batches[0]
    for batch in batches[1:]:
        dataset = dataset.concatenate(batch)
    return dataset


def fit(model, steps, name, eagerly=False):
    """``steps`` global batches of Adam; ``eagerly`` (the one-process reference): no tracing,
    a third of its time here (the same numbers within float rounding)."""
    model.compile(optimizer=keras.optimizers.Adam(LR), run_eagerly=eagerly,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(data(steps, name), epochs=1, shuffle=False, verbose=0)
    return history.history["loss"]


def values(model, plan):
    from tfdist.tensor.nested import entry_variables

    return [np.asarray(v.numpy()).tolist() for entry in plan.layers
            for v in entry_variables(model, entry)]


def sabotage_rows():
    """Row-split layers skip their all-reduce across processes (not in the one-process check)."""
    from tfdist.parallel import mappings
    from tfdist.tensor import inplace

    row = inplace._WRAPS["row"]

    def skipping(layer, group, timeout):
        row(layer, group, timeout)
        if not hasattr(group, "reduce_locally"):
            call = layer.call

            def partial(inputs, training=None):
                saved = mappings.reduce_from_group
                mappings.reduce_from_group = lambda x, *_: x
                try:
                    return call(inputs, training)
                finally:
                    mappings.reduce_from_group = saved

            layer.call = partial

    inplace._WRAPS["row"] = skipping


def skip_data_average():
    """The D x T sabotage: each data replica applies its own gradients (no mean over replicas)."""
    from tfdist.tensor.model import TensorModel

    TensorModel.average_gradients = lambda self, gradients: gradients


def train_one(strategy, name, steps, reference, save=None):
    started = time.monotonic()
    keras.utils.set_random_seed(1)
    whole = build(name)
    model = strategy.build_model(whole)
    plan = strategy.plan
    built = time.monotonic()
    result = {"loss": fit(model, steps, name), "plan": plan.as_dict(),
              "held_bytes": strategy.weight_bytes(model)}
    result["seconds"] = {"build": built - started, "fit": time.monotonic() - built}
    gathered = strategy.gather_weights(model)
    if save:
        result["saved"] = strategy.save_model(model, save)
    if strategy.is_chief:
        result["trained"] = [np.asarray(w).tolist() for entry in plan.layers
                             for w in gathered.get(entry.name, [])]
        result["initial"] = values(whole, plan)
        if save:
            loaded = keras.models.load_model(save)
            result["reloaded"] = values(loaded, plan)
        if reference:
            started = time.monotonic()
            result["reference_loss"] = fit(whole, steps, name, eagerly=True)
            result["reference"] = values(whole, plan)
            result["seconds"]["reference"] = time.monotonic() - started
    return result


def from_function(strategy, name):
    """The model built by ``build_model(fn)``: every process draws its own weights (its own
    seed); the shards must be slices of rank 0's draw, and the whole gathered back rank 0's."""
    drawn = {}

    def fn():
        model = build(name)
        try:
            drawn.update({v.path: v.numpy() for v in model.weights})
        except Exception:  # the description without weights, made first  # noqa: BLE001
            pass
        return model

    keras.utils.set_random_seed(100 + strategy.rank)
    model = strategy.build_model(fn)
    plan = strategy.plan
    gathered = strategy.gather_weights(model)
    whole = [drawn[w.name] for entry in plan.layers for w in entry.weights]
    mine = [np.asarray(v) for entry in plan.layers for v in gathered.get(entry.name, [])]
    return {"held_bytes": strategy.weight_bytes(model), "bytes": plan.bytes_per_process,
            "gap_to_own_draw": max(float(np.max(np.abs(a - b))) for a, b in
                                   zip(mine, whole, strict=True)) if strategy.is_chief else None}


def main(argv):
    global GLOBAL
    if "--global" in argv:
        GLOBAL = int(argv[argv.index("--global") + 1])
    steps = int(argv[0])
    names = [a for a in argv[1:] if a in MODELS]
    strategy = tfdist.get_strategy("auto")
    result = {"shards": strategy.shards, "replicas": strategy.num_replicas, "models": {}}
    save = argv[argv.index("--save") + 1] if "--save" in argv else None
    for name in names:
        result["models"][name] = train_one(strategy, name, steps, reference=True,
                                           save=save if name == names[0] else None)
    if "--then-from-function" in argv:
        result["from_function"] = from_function(strategy, names[0])
    if "--then-sabotage" in argv:
        sabotage_rows()
        result["sabotage"] = train_one(strategy, names[0], steps, reference=False)
    if "--then-skip-data-average" in argv:
        skip_data_average()
        result["sabotage"] = train_one(strategy, names[0], steps, reference=False)
    report(result)


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_after_report()
