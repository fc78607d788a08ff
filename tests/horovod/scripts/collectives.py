"""The collectives of `tfdist.horovod.ops` and `HorovodStrategy`, under ``horovodrun -np 2``.

Also Horovod's ``broadcast_variables`` (tf and Keras variables) and tfdist's binding of Horovod's
metric-average callback (a non-numeric log entry is left alone).

Rank r contributes values built from r; each rank reports what it got back.
"""

from __future__ import annotations

import tensorflow as tf

import tfdist.horovod as thvd
from tfdist.core.flavour import get_keras
from tfdist.horovod import ops
from tfdist.strategies.horovod import HorovodStrategy
from tfdist.testing import report


def plain_ops(rank: int) -> dict:
    out = {}
    summed = ops.allreduce([tf.constant([rank + 1.0, 10.0 * (rank + 1)]), None], op="sum")
    out["sum"], out["sum_none"] = summed[0].numpy().tolist(), summed[1]
    out["average"] = ops.allreduce([tf.constant(rank + 1.0)])[0].numpy().item()
    fp16 = ops.allreduce([tf.constant([1.0 / 3 + rank])], compression="fp16")[0]
    out["fp16"], out["fp16_dtype"] = fp16.numpy().tolist(), fp16.dtype.name
    traced = tf.function(lambda: ops.allreduce([tf.constant(rank + 1.0)], op="sum")[0])
    out["traced_sum"] = traced().numpy().item()
    out["gather0"] = ops.allgather(tf.constant([[rank, rank]]), axis=0).numpy().tolist()
    out["gather1"] = ops.allgather(tf.constant([[rank, rank]]), axis=1).numpy().tolist()
    keras = get_keras()
    variables = [tf.Variable([rank + 5.0]), keras.Variable(float(rank + 7))]
    thvd.init().broadcast_variables(variables, root_rank=1)  # Horovod's, on Keras 3 variables too
    out["broadcast"] = [float(tf.reduce_sum(tf.convert_to_tensor(v))) for v in variables]
    logs = {"loss": float(rank), "accuracy": 2.0 * rank, "note": "x"}
    thvd.MetricAverageCallback().on_epoch_end(0, logs)
    out["logs"] = logs
    return out


def strategy_ops(rank: int) -> dict:
    strategy = HorovodStrategy()

    def step() -> tuple:
        context = tf.distribute.get_replica_context()
        mean = context.all_reduce(tf.distribute.ReduceOp.MEAN, tf.constant(rank * 4.0))
        return mean, context.replica_id_in_sync_group

    mean, replica_id = tf.function(lambda: strategy.run(step))()
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: ctx.replica_id_in_sync_group * 10)
    with strategy.scope():
        variable = tf.Variable(float(rank) + 1.0)  # rank 0's value everywhere
    sharded = strategy.distribute_dataset(
        lambda ctx: tf.data.Dataset.range(8).batch(ctx.get_per_replica_batch_size(4)))
    unsplit = HorovodStrategy(split_batches=False).experimental_distribute_dataset(
        tf.data.Dataset.range(4).batch(2))
    return {"distribute_dataset": [b.numpy().tolist() for b in sharded],
            "unsplit": [b.numpy().tolist() for b in unsplit],
            "mean": mean.numpy().item(),
            "replica_id": int(replica_id),
            "values": int(values),
            "gather": strategy.gather(tf.constant([[rank]]), axis=0).numpy().tolist(),
            "reduce_mean": strategy.reduce("MEAN", tf.constant([rank, rank + 2.0]), axis=0)
            .numpy().item(), "scoped_variable": variable.numpy().item(),
            "input_context": [strategy.input_context().num_input_pipelines,
                              strategy.input_context().input_pipeline_id]}


def collectives() -> dict:
    """This rank's results of every op (``parity.py`` runs it as one of its modes)."""
    return {"ops": plain_ops(thvd.rank()), "strategy": strategy_ops(thvd.rank())}


if __name__ == "__main__":
    thvd.init()
    report(collectives())
