"""A task that records where `tfdist.parallel.process_place` says it sits (no TensorFlow)."""

import json
import os
from pathlib import Path

from tfdist.parallel import process_place

place = process_place()
task = json.loads(os.environ["TF_CONFIG"])["task"]
record = {"task": task, "shape": place.mesh.to_env(), "rank": place.rank,
          "coordinates": place.coordinates._asdict(),
          "pipe_group": list(place.group("pipe").members)}
Path(os.environ["MARKER_DIR"], f"{place.rank}.json").write_text(json.dumps(record))
