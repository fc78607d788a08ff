"""``--ray [ADDRESS]``: a job as a gang of Ray actors.

* `gang`: `RayGang` and `run_on_ray`, the job's actors in one placement group.
* `actor`: the actor that runs one task on its Ray node.
* `options`: `RayOptions`.
"""
