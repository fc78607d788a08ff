"""The wheel: what ``pip install .`` (or the wheel) installs, and that it works on its own.

Editable installs hide packaging mistakes (a directory without ``__init__.py`` still imports from
the checkout), so these tests build the wheel and look at it:

* Fast (unit): build the wheel (``pip wheel --no-deps --no-build-isolation``, about 1 s) from a
  copy of the checkout, so no ``build/`` or ``*.egg-info`` is written into it and two runs do not
  race, then read it: every module of ``tfdist/`` is in it, nothing else is, and its metadata
  declares the version, the console scripts and dependency ranges.
* Slow: install the wheel alone into a fresh venv (``python -m venv --without-pip``, then
  ``pip install --no-index --no-compile WHEEL``), then, from a directory outside the checkout, run
  ``tfdist-launch --check``, a real 2-worker MultiWorkerMirrored job, ``--export`` without the
  ``export`` extra, and import the launcher, bench and testing modules. The fresh venv sees the
  test venv's copies of the wheel's core dependencies and theirs (TensorFlow, tf-keras, NumPy, ...)
  and pip, nothing else (no tfdist, Horovod or test tools), through a ``.pth`` that names a
  folder of links to them: the wheel itself is installed for real (its files, its console
  scripts) and pip checks its declared dependency ranges against those packages
  (``--no-index``: a range they do not meet fails the install instead of fetching another
  version). Nothing of the checkout or the test venv's tfdist is
  importable there (the test asserts where tfdist is imported from).

Measured on this project's 2 shared cores (load 3-5): building the wheel 1 s. Before the links
(until November 2026) the test installed the wheel's dependencies from the package index: the
fresh venv 5 s, the install 33-53 s (the 572 MB TensorFlow wheel dominates), the whole test 65-95
s; it proved the same of the wheel, plus that the index serves the dependencies, which is pip's
and the index's business, not the wheel's. Measured one after the other (load 4-14): 72 CPU-s
(pytest and its children) with the index, 30 with the links.
"""

from __future__ import annotations

import configparser
import email.parser
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import tfdist

REPO = Path(__file__).resolve().parents[2]
TINY_TRAIN = Path(__file__).parent / "scripts" / "tiny_train.py"
# Left out of the copy the wheel is built from: never inputs of the build.
_NOT_SOURCES = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                ".ruff_cache", "runs", "bench_results")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout, built without touching the checkout."""
    setuptools = importlib.metadata.version("setuptools")
    if int(setuptools.split(".")[0]) < 77:
        pytest.fail(f"Cannot build the wheel without build isolation. Received: setuptools "
                    f"{setuptools} in {sys.prefix}. Expected: setuptools>=77 (pyproject's "
                    "[build-system]). Fix: bash launch/setup.sh, or pip install -U setuptools.")
    src = tmp_path_factory.mktemp("src") / "tfdist-src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(*_NOT_SOURCES))
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         str(src), "-w", str(out)],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"building the wheel failed:\n{result.stdout}{result.stderr}"
    (built,) = out.glob("tfdist-*.whl")
    return built


def _dist_info(whl: zipfile.ZipFile, name: str) -> str:
    (path,) = [n for n in whl.namelist() if n.endswith(f".dist-info/{name}")]
    return whl.read(path).decode()


# Directories of modules that are not packages, shipped as package data (pyproject).
_DATA_DIRS = ("_startup",)  # the start-up hook's sitecustomize.py (tfdist.startup_hook)


def test_every_package_directory_has_an_init_py():
    missing = sorted(
        str(d.relative_to(REPO)) for d in [REPO / "tfdist", *(REPO / "tfdist").rglob("*")]
        if d.is_dir() and d.name not in ("__pycache__", *_DATA_DIRS) and any(d.glob("*.py"))
        and not (d / "__init__.py").exists())
    assert not missing, (
        f"Package directories without __init__.py: {missing}. Expected: every directory of "
        "tfdist/ with modules is a regular package (pyproject sets namespaces = false, so the "
        "wheel leaves these out). Fix: add an __init__.py with a docstring.")


@pytest.mark.slow  # builds the wheel (2 CPU-s): make test, not test-fast
def test_the_wheel_holds_every_module_of_the_checkout_and_nothing_else(wheel):
    in_repo = {p.relative_to(REPO).as_posix() for p in (REPO / "tfdist").rglob("*.py")
               if "__pycache__" not in p.parts}
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
    in_wheel = {n for n in names if n.startswith("tfdist/")}
    assert in_repo - in_wheel == set(), "modules of the checkout missing from the wheel"
    assert in_wheel - in_repo == set(), "files in the wheel that the checkout does not have"
    top_level = {n.split("/", 1)[0] for n in names}
    assert top_level == {"tfdist", f"tfdist-{tfdist.__version__}.dist-info"}  # no tests/, examples
    assert "tfdist/launcher/__init__.py" in in_wheel
    assert "tfdist/_startup/sitecustomize.py" in in_wheel  # package data: the start-up hook


@pytest.mark.slow  # the wheel's build, as above
def test_the_wheel_declares_version_scripts_and_dependency_ranges(wheel):
    with zipfile.ZipFile(wheel) as whl:
        meta = email.parser.Parser().parsestr(_dist_info(whl, "METADATA"))
        entry_points = configparser.ConfigParser()
        entry_points.read_string(_dist_info(whl, "entry_points.txt"))
    assert meta["Version"] == tfdist.__version__
    assert meta["Requires-Python"] == ">=3.11"
    assert dict(entry_points["console_scripts"]) == {
        "tfdist-launch": "tfdist.launcher.cli:main", "tfdist-bench": "tfdist.bench.cli:main",
        "tfdist-advise": "tfdist.advise.cli:main"}
    requires = meta.get_all("Requires-Dist")
    core = {r.split("<")[0].split(">")[0].split("=")[0].strip(): r for r in requires
            if "extra ==" not in r}
    assert set(core) == {"tensorflow", "tf-keras", "numpy", "absl-py", "tensorboard"}
    for name in ("tensorflow", "tf-keras"):
        assert ">=" in core[name] and "<" in core[name] and "==" not in core[name], core[name]
    assert not [r for r in requires if "==" in r.split(";")[0]], "pins belong in launch/setup.sh"
    assert set(meta.get_all("Provides-Extra")) == {"examples", "export", "test", "docs", "bench",
                                                   "horovod", "ray"}
    assert 'pyyaml; extra == "export"' in requires and 'pyyaml; extra == "test"' in requires


def test_importing_tfdist_stays_light():
    """``import tfdist`` loads no TensorFlow or NumPy: the launcher and build tools rely on it.

    setuptools reads ``__version__`` from the source without importing tfdist; were it ever to
    import it (a computed version), this keeps that cheap.
    """
    code = ("import sys, tfdist; print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'tensorflow', 'keras', 'tf_keras', 'numpy', 'yaml'}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def _clean_env(venv: Path) -> dict[str, str]:
    """This environment with only the fresh venv's Python: nothing of the checkout or test venv."""
    drop = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONSAFEPATH"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("TFDIST_")}
    outer_bin = str(Path(sys.executable).parent)
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != outer_bin]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    env["PYTHONNOUSERSITE"] = "1"
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def _link_dependencies(whl: Path, into: Path) -> Path:
    """A folder of links to what the wheel's core dependencies (``Requires-Dist`` without an
    extra, and theirs, as installed in the test venv) and pip are made of: ``into``, for a fresh
    venv's ``.pth``. Nothing else of the test venv (tfdist, Horovod, Ray, the test tools)."""
    with zipfile.ZipFile(whl) as opened:
        meta = email.parser.Parser().parsestr(_dist_info(opened, "METADATA"))
    wanted = [Requirement(r) for r in meta.get_all("Requires-Dist")] + [Requirement("pip")]
    seen: set[str] = set()
    into.mkdir()
    while wanted:
        req = wanted.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        dist = importlib.metadata.distribution(name)
        wanted += [Requirement(r) for r in dist.requires or ()]
        site = Path(str(dist.locate_file("")))
        tops = {f.parts[0] for f in dist.files or ()} - {"..", "__pycache__"}  # "..": bin/
        for top in tops:
            if not (into / top).exists():
                (into / top).symlink_to(site / top)
    return into


def _venv_site_packages(venv: Path) -> Path:
    (site,) = (venv / "lib").glob("python3.*/site-packages")
    return site


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_the_wheel_alone_in_a_fresh_venv_runs_a_two_worker_job(wheel, tmp_path):
    venv, elsewhere = tmp_path / "venv", tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _clean_env(venv)

    def run(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), cwd=elsewhere, env=env, capture_output=True,
                              text=True, timeout=timeout)

    made = run(sys.executable, "-m", "venv", "--without-pip", str(venv), timeout=120)
    assert made.returncode == 0, made.stderr
    third_party = _link_dependencies(wheel, tmp_path / "dependencies")
    (_venv_site_packages(venv) / "test_venv_dependencies.pth").write_text(f"{third_party}\n")
    python = str(venv / "bin" / "python")
    hidden = run(python, "-c", "import tfdist")
    assert hidden.returncode != 0 and "No module named 'tfdist'" in hidden.stderr, (
        "the fresh venv sees a tfdist before the wheel is installed", hidden.stderr)
    installed = run(python, "-m", "pip", "install", "-q", "--no-index", "--no-compile",
                    str(wheel), timeout=480)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    listed = run(python, "-m", "pip", "show", "-f", "tfdist")
    assert listed.returncode == 0, listed.stderr
    assert f"Location: {_venv_site_packages(venv)}" in listed.stdout  # installed, not linked
    assert "../../../bin/tfdist-launch" in listed.stdout  # its console scripts, from the wheel

    imported = run(python, "-c", "import tfdist, tfdist.testing, tfdist.launcher.cli, "
                   "tfdist.bench.cli; print(tfdist.__file__)")
    assert imported.returncode == 0, imported.stderr
    assert Path(imported.stdout.strip()).is_relative_to(venv), "tfdist imported from outside"

    check = run(str(venv / "bin" / "tfdist-launch"), "--check", timeout=120)
    assert check.returncode == 0, check.stderr
    assert f"tfdist: {tfdist.__version__}\n" in check.stdout
    assert "tensorflow: 2." in check.stdout and "tf_keras: 2." in check.stdout
    assert "horovod:\n  installed: False" in check.stdout

    exported = run(str(venv / "bin" / "tfdist-launch"), "--export", "kubeflow", "--image",
                   "me/t:1", "--workers", "2", "train.py")
    assert exported.returncode == 2 and "pip install 'tfdist[export]'" in exported.stderr

    script = shutil.copy(TINY_TRAIN, elsewhere / "tiny_train.py")
    job = run(str(venv / "bin" / "tfdist-launch"), "--strategy", "multi_worker", "--workers",
              "2", "--timeout", "240", "--verbose", str(script))  # --verbose: both workers' lines
    assert job.returncode == 0, job.stdout[-4000:] + job.stderr[-4000:]
    results = {}
    for line in job.stdout.splitlines():
        if "TINY_TRAIN " in line:
            result = json.loads(line.split("TINY_TRAIN ", 1)[1])
            results[result["task"]] = result
    assert set(results) == {"worker:0", "worker:1"}, job.stdout[-4000:]
    first, second = results["worker:0"], results["worker:1"]
    assert first["num_workers"] == 2 and first["keras"] == "keras3"  # the launcher's default
    assert (first["kernel"], first["bias"]) == (second["kernel"], second["bias"])  # allreduced
    assert first["loss_after"] < first["loss_before"] / 100
    assert first["kernel"] == pytest.approx(3.0, abs=0.2)
    assert first["bias"] == pytest.approx(1.0, abs=0.2)
