"""Times training steps of one Transformer LM under ``--mode tensor`` (T processes, the layers
split), ``multi_worker`` (the same processes, data parallel), ``pipeline`` (the graph cut into
stages) or ``default`` (one process).

Usage: ``python -m tfdist.bench.workers.tensor_worker --mode tensor --shards 2``. Every mode
times ``fit`` over ``--steps`` global batches after a warm-up fit. Under ``tensor`` each process
also times, alone, one sum of a ``batch x seq x width`` float32 activation over its tensor group
(the all-reduce a split block does twice forward and twice backward), and reports the bytes of
the weights it holds against the plan's prediction. ``--model gpt2`` times KerasHub's
``GPT2CausalLM`` built from a config of the same sizes instead (no download; inputs
``token_ids`` and an all-ones ``padding_mask``; its blocks split inside, its token embedding
tied to the output and split by vocabulary).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import numpy as np

from tfdist.probe.common import apply_threads, median, time_call
from tfdist.testing import report


def build(keras: Any, vocab: int, seq: int, width: int, heads: int, blocks: int) -> Any:
    """A GPT-style LM: token embedding, ``blocks`` x (causal attention, feed-forward) with
    LayerNorm and residuals, the vocabulary projection (no position embedding: the benchmark
    times steps, not what is learned)."""
    layers = keras.layers
    tokens = keras.Input((seq,), dtype="int32", name="tokens")
    x = layers.Embedding(vocab, width, name="token_embedding")(tokens)
    for b in range(blocks):
        h = layers.LayerNormalization(name=f"block{b}_attention_norm")(x)
        h = layers.MultiHeadAttention(heads, width // heads, name=f"block{b}_attention")(
            h, h, use_causal_mask=True)
        x = layers.Add(name=f"block{b}_attention_residual")([x, h])
        h = layers.LayerNormalization(name=f"block{b}_ffn_norm")(x)
        h = layers.Dense(4 * width, activation="gelu", name=f"block{b}_ffn_in")(h)
        x = layers.Add(name=f"block{b}_ffn_residual")(
            [x, layers.Dense(width, name=f"block{b}_ffn_out")(h)])
    x = layers.LayerNormalization(name="final_norm")(x)
    return keras.Model(tokens, layers.Dense(vocab, name="lm_head")(x), name="bench_lm")


def build_gpt2(vocab: int, seq: int, width: int, heads: int, blocks: int) -> Any:
    """KerasHub's GPT-2 causal LM at the benchmark's sizes (feed-forward ``4 x width``, no
    dropout), built from its config: nothing is downloaded."""
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=vocab, num_layers=blocks, num_heads=heads, hidden_dim=width,
        intermediate_dim=4 * width, max_sequence_length=seq, dropout=0.0)
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def batches(args: argparse.Namespace, strategy: Any) -> tuple[Any, Any, int]:
    """``steps`` global batches of next-token data (the same on every process), a worker's
    part of each under ``multi_worker``: inputs, targets and the per-process batch size."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, args.vocab, size=(args.batch * args.steps, args.seq + 1))
    x, y = tokens[:, :-1].astype("int32"), tokens[:, 1:].astype("int32")
    batch = args.batch
    if args.mode == "multi_worker":  # each worker reads its part of every global batch
        per = args.batch // strategy.num_replicas
        x = x.reshape(args.steps, strategy.num_replicas, per, args.seq)[:, strategy.worker_index]
        y = y.reshape(args.steps, strategy.num_replicas, per, args.seq)[:, strategy.worker_index]
        x, y, batch = x.reshape(-1, args.seq), y.reshape(-1, args.seq), per
    if args.model == "gpt2":
        x = {"token_ids": x, "padding_mask": np.ones_like(x)}
    return x, y, batch


def allreduce_seconds(strategy: Any, rows: int, seq: int, width: int) -> float:
    """The median time of one sum of a ``rows x seq x width`` float32 tensor over the tensor
    group (the activation all-reduce of a split block)."""
    import tensorflow as tf

    from tfdist.parallel.mappings import all_reduce_sum

    value = tf.random.normal([rows, seq, width])
    group = strategy.tensor_group

    @tf.function
    def reduce() -> Any:
        return all_reduce_sum(value, group)

    reduce()
    return median([time_call(lambda: reduce().numpy()) for _ in range(7)])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("tensor", "multi_worker", "pipeline", "default"),
                        required=True)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--model", choices=("lm", "gpt2"), default="lm")
    args = parser.parse_args(argv)
    apply_threads()
    import keras

    import tfdist

    keras.utils.set_random_seed(0)
    options = {"shards": args.shards} if args.mode == "tensor" else {}
    strategy = tfdist.get_strategy(args.mode, **options)
    sizes = (args.vocab, args.seq, args.width, args.heads, args.blocks)
    model = strategy.build_model(lambda: build_gpt2(*sizes) if args.model == "gpt2"
                                 else build(keras, *sizes))
    result: dict[str, Any] = {"mode": args.mode, "processes": strategy.num_workers,
                              "weight_bytes": int(sum(v.numpy().nbytes for v in model.weights))}
    if args.mode == "tensor":
        result["allreduce_s"] = allreduce_seconds(strategy, args.batch, args.seq, args.width)
        result["planned_bytes"] = strategy.plan.bytes_per_process
    with strategy.scope():
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y, batch = batches(args, strategy)
    warm = {k: v[: batch * 2] for k, v in x.items()} if isinstance(x, dict) else x[: batch * 2]
    model.fit(warm, y[: batch * 2], batch_size=batch, epochs=1, verbose=0,
              shuffle=False)  # warm-up; a shuffle gives shards other batches (refused)
    seconds = time_call(lambda: model.fit(x, y, batch_size=batch, epochs=1, verbose=0,
                                          shuffle=False))
    result["step_s"] = seconds / args.steps
    report(result)


if __name__ == "__main__":
    main()
