"""Short measurements on real processes, shared by the benchmark and the advisor.

* `jobs`: starts measuring processes (a TF cluster, a ``horovodrun`` job, one local process).
* `allreduce`: each backend's all-reduce against a loopback TCP ring timed in the same processes
  (`tfdist.bench` runs it at every size; `tfdist.advise.network` at a few, to fit its constants).
* `common`: what every measuring process shares (thread pools, timing, the TCP ring).
* `machine`: what the numbers were measured on.

It sits below both `tfdist.bench` and `tfdist.advise`; neither imports the other for it.
"""
