"""A small Transformer language model on generated text, under every strategy (tensor and 3D too).

Runs unchanged on one process and under every tfdist strategy::

    python keras_examples/transformer_lm.py
    tfdist-launch --workers 2 keras_examples/transformer_lm.py            # multi_worker
    tfdist-launch --strategy horovod --workers 2 keras_examples/transformer_lm.py
    tfdist-launch --strategy pipeline --stages 2 --workers 2 --micro-batches 4 \\
        keras_examples/transformer_lm.py                                  # 2 stages
    tfdist-launch --strategy tensor --tensor 2 --workers 2 \\
        keras_examples/transformer_lm.py                                  # heads split 2 ways
    tfdist-launch --strategy tensor --tensor 2 --workers 4 \\
        keras_examples/transformer_lm.py                                  # 2 replicas x 2 shards
    tfdist-launch --strategy pipeline --stages 2 --tensor 2 --workers 4 --micro-batches 2 \\
        keras_examples/transformer_lm.py                                  # 2 stages x 2 shards

The text is generated (no download): each sequence counts up from a random token by a random
stride (modulo the vocabulary), so the next token follows from the previous two and a model that
attends learns it; next-token accuracy on held-out sequences says whether it did. The model is
GPT-style: token + learned position embedding, ``--blocks`` x (LayerNorm, causal multi-head
attention, residual; LayerNorm, a feed-forward pair, residual), a final LayerNorm and the
vocabulary projection, all standard Keras layers but the position embedding. Under ``tensor``
the attention is split by heads, each feed-forward pair by columns then rows, the token embedding
and the projection by vocabulary (the plan is printed); under ``pipeline`` the graph is cut
between blocks, the residual stream carried across the cut.

The whole model goes to ``<model-dir>/model.keras``; the chief then loads it alone and scores the
held-out sequences with it, and prints one JSON line: strategy, replicas, final loss, held-out
next-token accuracy, samples per second.
"""

from __future__ import annotations

import os
import time

import common
import numpy as np

from tfdist.core import flavour

SEED = 1234


def parse_args(argv: list[str] | None = None):
    parser = common.base_parser(__doc__.splitlines()[0], epochs=3, batch_size=32,
                                learning_rate=3e-3, model_dir="runs/transformer_lm")
    parser.add_argument("--vocab", type=int, default=32, help="tokens (default 32)")
    parser.add_argument("--seq", type=int, default=16, help="sequence length (default 16)")
    parser.add_argument("--width", type=int, default=32, help="model width (default 32)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    parser.add_argument("--blocks", type=int, default=2, help="Transformer blocks (default 2)")
    parser.add_argument("--samples", type=int, default=2048,
                        help="training sequences (default 2048; a quarter more are held out)")
    return parser.parse_args(argv)


def counting_text(samples: int, seq: int, vocab: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``samples`` sequences of ``seq + 1`` tokens counting up from a random start by a random
    stride in 1..3 (mod ``vocab``); returns (inputs, next tokens), each ``(samples, seq)``."""
    rng = np.random.default_rng(seed)
    start = rng.integers(0, vocab, size=(samples, 1))
    stride = rng.integers(1, 4, size=(samples, 1))
    tokens = ((start + stride * np.arange(seq + 1)) % vocab).astype("int32")
    return tokens[:, :-1], tokens[:, 1:]


def position_embedding_class(keras):
    """A layer adding a learned vector per position (registered: its config rebuilds it)."""

    @keras.saving.register_keras_serializable("tfdist_examples")
    class PositionEmbedding(keras.layers.Layer):
        def __init__(self, length: int, width: int, **kwargs):
            super().__init__(**kwargs)
            self.length, self.width = length, width

        def build(self, input_shape):
            self.positions = self.add_weight(name="positions", shape=(self.length, self.width),
                                             initializer="glorot_uniform")

        def call(self, inputs):
            return inputs + self.positions[None]

        def get_config(self):
            return {**super().get_config(), "length": self.length, "width": self.width}

    return PositionEmbedding


def build_model(keras, vocab: int, seq: int, width: int, heads: int, blocks: int):
    """The whole model (uncompiled): token ids ``(batch, seq)`` -> next-token logits."""
    layers = keras.layers
    tokens = keras.Input((seq,), dtype="int32", name="tokens")
    x = layers.Embedding(vocab, width, name="token_embedding")(tokens)
    x = position_embedding_class(keras)(seq, width, name="position_embedding")(x)
    for b in range(blocks):
        h = layers.LayerNormalization(name=f"block{b}_attention_norm")(x)
        h = layers.MultiHeadAttention(heads, width // heads, name=f"block{b}_attention")(
            h, h, use_causal_mask=True)
        x = layers.Add(name=f"block{b}_attention_residual")([x, h])
        h = layers.LayerNormalization(name=f"block{b}_ffn_norm")(x)
        h = layers.Dense(4 * width, activation="gelu", name=f"block{b}_ffn_in")(h)
        h = layers.Dense(width, name=f"block{b}_ffn_out")(h)
        x = layers.Add(name=f"block{b}_ffn_residual")([x, h])
    x = layers.LayerNormalization(name="final_norm")(x)
    logits = layers.Dense(vocab, name="lm_head")(x)
    return keras.Model(tokens, logits, name="transformer_lm")


def next_token_accuracy(keras, saved: str, x_test: np.ndarray, y_test: np.ndarray) -> float:
    """Held-out next-token accuracy of the saved whole model, loaded in this one process (the
    same code under every strategy: ``save_model`` gathers the whole model, whatever held it)."""
    model = keras.models.load_model(saved)
    logits = model.predict(x_test, batch_size=256, verbose=0)
    return float(np.mean(np.argmax(logits, axis=-1) == y_test))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    keras = flavour.get_keras()
    keras.utils.set_random_seed(SEED)
    x, y = counting_text(args.samples + args.samples // 4, args.seq, args.vocab, SEED)
    x_train, y_train, x_test, y_test = (x[:args.samples], y[:args.samples], x[args.samples:],
                                        y[args.samples:])
    strategy = common.make_strategy(args.strategy)
    common.log(strategy, strategy.describe())
    global_batch = strategy.global_batch_size(args.per_replica_batch_size)
    steps_per_epoch = max(1, len(x_train) // global_batch)

    model = strategy.build_model(lambda: build_model(
        keras, args.vocab, args.seq, args.width, args.heads, args.blocks))
    with strategy.scope():
        model.compile(optimizer=keras.optimizers.Adam(strategy.scale_learning_rate(
                          args.learning_rate)),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    started = time.perf_counter()
    history = model.fit(
        strategy.distribute_dataset(common.shuffled_batches(x_train, y_train, global_batch,
                                                            SEED)),
        epochs=args.epochs, steps_per_epoch=steps_per_epoch,
        callbacks=[*strategy.callbacks(
                       tensorboard=os.path.join(args.model_dir, common.TENSORBOARD_DIR)),
                   strategy.backup_callback(os.path.join(args.model_dir, "backup"))],
        verbose=2 if strategy.is_chief else 0,
    )
    seconds = time.perf_counter() - started
    saved = strategy.save_model(model, os.path.join(args.model_dir, common.MODEL_FILE))
    accuracy = next_token_accuracy(keras, saved, x_test, y_test) if saved else None
    summary = {
        "example": "transformer_lm", "epochs": args.epochs,
        **common.history_fields(history, steps_per_epoch, global_batch, seconds),
        "test_accuracy": accuracy, "model_path": saved,
    }
    return common.finish(strategy, summary)


if __name__ == "__main__":
    main()
