"""Benchmarks of tfdist on this machine: collectives, training throughput, parameter servers.

Sections (``tfdist-bench SECTION`` or ``python -m tfdist.bench SECTION``; default: all):

* ``allreduce``: busbw of TF's collective ring (gRPC) and Horovod (Gloo) from 4 KiB to 64 MiB,
  against a loopback TCP ring measured in the same processes (`tfdist.probe.allreduce`).
* ``train``: samples/s per strategy at 1 and N replicas, scaling efficiency, and tfdist's
  overhead over the raw ``tf.distribute`` / Horovod way (`tfdist.bench.train`).
* ``ps``: a sparse CTR model, async parameter servers (1 and 2 ps) vs sync multi-worker,
  ``steps_per_execution`` 1 vs 10 (`tfdist.bench.ps`).

Each run writes ``bench_results/bench-<date>.json`` (with the machine: cores, CPU, versions,
date), a markdown table (``.md``, also printed), the children's log and a busbw plot (PNG,
needs ``pip install tfdist[bench]``). ``--quick`` is a smoke run; its numbers mean little.

Example:
    ``tfdist-bench --quick`` or ``tfdist-bench allreduce --np 4 --repeats 9``
"""

__all__: list[str] = []
