"""A task that records where `tfdist.Mesh.from_environment` says it sits (no TensorFlow)."""

import json
import os
from pathlib import Path

from tfdist.parallel.mesh import Mesh

mesh, rank = Mesh.from_environment()
task = json.loads(os.environ["TF_CONFIG"])["task"]
record = {"task": task, "shape": mesh.to_env(), "rank": rank,
          "coordinates": mesh.coordinates(rank)._asdict(),
          "pipe_group": list(mesh.group("pipe", rank).members)}
Path(os.environ["MARKER_DIR"], f"{rank}.json").write_text(json.dumps(record))
