"""tfdist's start-up hook for the tasks ``tfdist-launch`` starts (this directory leads their
PYTHONPATH; see `tfdist.startup_hook`). It runs at interpreter start: it first runs the
``sitecustomize`` this one hides (the next on ``sys.path``), then arms an import hook that
installs the Keras 3 shims when Keras is imported. TensorFlow is not imported here.
"""

import importlib
import os
import sys


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        importlib.import_module("sitecustomize")
    except ImportError as err:
        if err.name != "sitecustomize":
            raise
    finally:
        sys.path[:] = saved
        hidden = sys.modules.pop("sitecustomize", None)
        if hidden is not None:
            sys.modules["tfdist_chained_sitecustomize"] = hidden
            # `from sitecustomize import X` keeps working for the names the hidden one defines
            mine = globals()
            for name, value in vars(hidden).items():
                if not name.startswith("__"):
                    mine.setdefault(name, value)
        if ours is not None:
            sys.modules["sitecustomize"] = ours


def _arm() -> None:
    try:
        from tfdist import startup_hook
    except ImportError:  # this interpreter has no tfdist (another venv): nothing to arm
        return
    startup_hook.arm()


_chain()
_arm()
