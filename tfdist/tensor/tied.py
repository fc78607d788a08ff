"""Tied input/output embeddings: one matrix for the token lookup and for the logits.

A language model often reuses its input embedding ``E`` (vocabulary x width) as its output
projection (logits ``= hidden @ E^T``, GPT-2's tied weights). tfdist recognises the tie by the
layer's class name and call convention, those of KerasHub's
``keras_hub.layers.ReversibleEmbedding``: a layer whose class is named ``ReversibleEmbedding``,
with an ``embeddings`` weight, called once as ``layer(ids)`` (a lookup) and once as
``layer(hidden, reverse=True)`` (the logits), that reversed call giving the model's only
output. Its config must keep the tie (``tie_weights`` true or absent) and hold no option the
split does not do (a regularizer, ``mask_zero``, LoRA, options of other layers); a
``logit_soft_cap`` and a ``reverse_dtype`` are applied as KerasHub applies them. Such a layer
is split once by vocabulary rows (kind ``tied``): the lookup is masked and summed over the
group, the reversed call gives this shard's vocabulary columns of the logits for the sharded
cross-entropy, and both uses' gradients add up in the one shard of ``E``.

A weight held by two layers (a layer of your own that reads another layer's ``embeddings``)
cannot stay tied when the shards are built from the layers' configs: `check_shared_weights`
refuses it before anything is built.

Example:
    >>> import keras
    >>> from tfdist.tensor.rules import plan_model
    >>> class Head(keras.layers.Layer):   # reads another layer's matrix: refused
    ...     def __init__(self, embedding, **kwargs):
    ...         super().__init__(**kwargs)
    ...         self.embedding = embedding
    ...     def call(self, x):
    ...         return x @ keras.ops.transpose(self.embedding.embeddings)
    >>> tokens = keras.Input((4,), dtype="int32")
    >>> embedding = keras.layers.Embedding(8, 2, name="emb")
    >>> model = keras.Model(tokens, Head(embedding, name="head")(embedding(tokens)))
    >>> plan_model(model, 2)
    Traceback (most recent call last):
    ...
    tfdist.errors.StrategyConfigError: Layers 'emb' and 'head' share the weight 'emb/embeddings'...
"""

from __future__ import annotations

from typing import Any

from tfdist.errors import StrategyConfigError, format_error

__all__ = ["TIED_CLASS", "TIED_OPTIONS", "is_tied_class", "why_not_tied",
           "check_shared_weights"]

TIED_CLASS = "ReversibleEmbedding"
TIED_OPTIONS = ("tie_weights", "logit_soft_cap", "reverse_dtype")
"""Config keys of a ``ReversibleEmbedding`` beyond an ``Embedding``'s."""
_EMBEDDING_OPTIONS = ("name", "trainable", "dtype", "input_dim", "output_dim",
                      "embeddings_initializer", "embeddings_regularizer", "activity_regularizer",
                      "embeddings_constraint", "mask_zero", "input_length", "lora_rank",
                      "lora_alpha", "quantization_config")


def is_tied_class(layer: Any) -> bool:
    """Whether ``layer``'s class is named like KerasHub's tied embedding (any module)."""
    return type(layer).__name__ == TIED_CLASS


def _reversed(node: Any) -> bool:
    arguments = node.arguments
    if "reverse" in arguments.kwargs:
        return bool(arguments.kwargs["reverse"])
    return len(arguments.args) > 1 and bool(arguments.args[1])


def _why_not_config(layer: Any) -> str | None:
    config = layer.get_config()
    if not config.get("tie_weights", True):
        return "tie_weights=False (a separate output matrix)"
    unknown = sorted(set(config) - set(_EMBEDDING_OPTIONS) - set(TIED_OPTIONS))
    if unknown:
        return f"options the split does not do: {unknown}"
    if any(config.get(key) for key in ("embeddings_regularizer", "activity_regularizer")):
        return "has a regularizer (its loss would be summed per shard)"
    if config.get("mask_zero"):
        return "mask_zero (the mask is computed whole)"
    if config.get("lora_rank") or config.get("quantization_config"):
        return "LoRA or quantization"
    if [w.path.split("/")[-1] for w in layer.weights] not in (["embeddings"], []):
        return "weights other than one 'embeddings' matrix"
    return None


def why_not_tied(layer: Any, model: Any) -> str | None:
    """Why ``layer`` of ``model`` cannot be split as a tied embedding (kind ``tied``), or None."""
    if not is_tied_class(layer):
        return f"not a {TIED_CLASS}"
    blocker = _why_not_config(layer)
    if blocker is not None:
        return blocker
    uses = [_reversed(node) for node in layer._inbound_nodes]
    if sorted(uses) != [False, True]:
        return "not called exactly once as layer(ids) and once as layer(hidden, reverse=True)"
    outputs = [t._keras_history for t in model.outputs]
    logits = uses.index(True)
    if len(outputs) != 1 or outputs[0][0] is not layer or outputs[0][1] != logits:
        return "its reversed call is not the model's only output (the loss reads the logits)"
    return None


def check_shared_weights(layers: list[Any]) -> None:
    """Refuses a weight held by two of ``layers``: built from their configs, each would get its
    own copy and the tie would be lost silently."""
    owners: dict[int, Any] = {}
    for layer in layers:
        for weight in layer.weights:
            first = owners.setdefault(id(weight), layer)
            if first is layer:
                continue
            raise StrategyConfigError(format_error(
                f"Layers {first.name!r} and {layer.name!r} share the weight {weight.path!r}: "
                "tfdist builds each process's layers from their configs, which would untie it.",
                received=f"{weight.path} in {first.name} ({type(first).__name__}) and "
                f"{layer.name} ({type(layer).__name__})",
                expected=f"each weight held by one layer; a tied embedding as one {TIED_CLASS} "
                "called as layer(ids) and layer(hidden, reverse=True)",
                fix=f"tie the embedding with keras_hub.layers.{TIED_CLASS}(tie_weights=True) "
                f"(or a layer of yours named {TIED_CLASS} with that call convention), or give "
                f"{layer.name!r} its own weight"))
