"""The start-up hook (`tfdist.startup_hook`): on every task's PYTHONPATH unless turned off, runs
the sitecustomize it hides, and imports nothing of TensorFlow or Keras at interpreter start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tfdist.launcher.options import JobOptions
from tfdist.launcher.plan import plan_job
from tfdist.startup_hook import HOOK_DIR, task_env

REPO = Path(__file__).resolve().parents[2]


def _python(code: str, pythonpath: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_every_planned_task_gets_the_hook_first_on_its_pythonpath():
    for options in (JobOptions("t.py", workers=2), JobOptions("t.py", workers=1, ps=1),
                    JobOptions("t.py", strategy="mirrored")):
        plan = plan_job(options, environ={"PYTHONPATH": "/src:/lib"})
        assert plan.env["PYTHONPATH"] == os.pathsep.join([str(HOOK_DIR), "/src", "/lib"])
    off = plan_job(JobOptions("t.py", workers=2), environ={"TFDIST_STARTUP_HOOK": "off"})
    assert "PYTHONPATH" not in off.env


def test_task_env_does_not_repeat_the_hook():
    once = task_env({"PYTHONPATH": "/src"})
    assert task_env(once) == once


def test_the_hook_ships_beside_the_module():
    assert (HOOK_DIR / "sitecustomize.py").is_file()
    assert not (HOOK_DIR / "__init__.py").exists(), "the directory must hold only sitecustomize"


def test_start_up_imports_no_tensorflow_and_arms_the_watcher():
    code = ("import sys; print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'tensorflow', 'keras', 'tf_keras', 'numpy'}), "
            "[type(f).__name__ for f in sys.meta_path][0])")
    out = _python(code, [str(HOOK_DIR), str(REPO)])
    assert out.strip() == "[] _KerasImportWatcher"


def test_the_hidden_sitecustomize_still_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import builtins\nbuiltins.SITE_RAN = 'yes'\n")
    code = "import builtins, sitecustomize; print(builtins.SITE_RAN, sitecustomize.__file__)"
    out = _python(code, [str(HOOK_DIR), str(tmp_path), str(REPO)])
    ran, hook_file = out.split()
    assert ran == "yes"
    assert Path(hook_file).parent == HOOK_DIR


def test_from_sitecustomize_import_keeps_working_under_the_hook(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("SITE_SETTING = 42\n")
    out = _python("from sitecustomize import SITE_SETTING; print(SITE_SETTING)",
                  [str(HOOK_DIR), str(tmp_path), str(REPO)])
    assert out.strip() == "42"


def test_an_empty_pythonpath_entry_the_current_directory_is_kept():
    assert task_env({"PYTHONPATH": ":/src"})["PYTHONPATH"] == os.pathsep.join(
        [str(HOOK_DIR), "", "/src"])
    assert task_env({})["PYTHONPATH"] == str(HOOK_DIR)  # unset adds no empty entry


def test_a_misspelled_hook_switch_is_refused_before_start():
    import pytest

    from tfdist.errors import StrategyConfigError

    with pytest.raises(StrategyConfigError) as info:
        plan_job(JobOptions("t.py", workers=2), environ={"TFDIST_STARTUP_HOOK": "of"})
    assert "Received: TFDIST_STARTUP_HOOK='of'" in str(info.value)
    assert "Fix: set TFDIST_STARTUP_HOOK=off" in str(info.value)
    assert "PYTHONPATH" in plan_job(JobOptions("t.py", workers=2),
                                    environ={"TFDIST_STARTUP_HOOK": "on"}).env
