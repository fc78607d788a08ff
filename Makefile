# The two commands a newcomer runs (see README.md). Both set up .venv/ first; re-running is cheap.
VENV_BIN := .venv/bin
MAIN_JOB := keras_examples/image_classifier.py

.PHONY: setup setup-minimal horovod slurm main test test-fast check lint docs wheel horovod-conformance horovod-examples

setup:  ## everything but Slurm: TensorFlow, tfdist, Horovod (the cached wheel, else a 2-5 min build), test tools
	bash launch/setup.sh

horovod: setup  ## what a --strategy horovod job needs, added to a `make main` set-up (same as setup)

setup-minimal:  ## what a job without Horovod needs (no Horovod, OpenMPI, keras-hub or multi-host test tools)
	bash launch/setup.sh --minimal

slurm:  ## setup, plus Slurm and munge (apt, as root) for tests/slurm
	bash launch/setup.sh --with-slurm

main: setup-minimal  ## a real 2-worker training on this machine; no Horovod (make horovod adds it)
	$(VENV_BIN)/tfdist-launch --strategy multi_worker --workers 2 --timeout 900 $(MAIN_JOB) --model-dir runs/main_job

test: slurm  ## the whole test suite (what CI runs) on 2 pytest-xdist workers, Slurm jobs included; ends with its wall time and 15 slowest tests
	PATH="$(CURDIR)/$(VENV_BIN):$$PATH" $(VENV_BIN)/python -m pytest -n 2 --dist loadgroup

# PYTHONPATH: the checkout's sitecustomize.py then runs in pytest's own processes too, whose Keras 3
# import leaves out scikit-learn, SciPy and matplotlib (TFDIST_TEST_LEAN_KERAS, which
# tests/conftest.py sets): about 1.5 CPU-s less in each xdist worker. --dist worksteal: a worker
# that runs out of tests takes half of the other's queue, so both end together (with the default
# --dist load, the heavy tensor and pipeline modules, last in the order, left one worker 20 s alone).
# PYTHONDONTWRITEBYTECODE= (empty: unset for Python): where a shell sets it, pytest rewrote the
# asserts of all ~150 test modules and Python compiled tfdist in every worker on every run; with
# the (git-ignored) __pycache__ kept, collecting the unit tests takes 7.1 CPU-s, not 9.3.
test-fast: setup  ## unit tests only (2 pytest-xdist workers): no cluster, under a minute
	PYTHONDONTWRITEBYTECODE= PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(VENV_BIN)/python -m pytest -m unit -n 2 --dist worksteal

lint: setup-minimal
	$(VENV_BIN)/ruff check .

docs: setup  ## the manual (docs/, mkdocs.yml) into site/; any warning fails the build
	NO_MKDOCS_2_WARNING=1 TF_CPP_MIN_LOG_LEVEL=3 $(VENV_BIN)/python -m mkdocs build --strict

check: setup-minimal  ## what is installed (Horovod included, or the command that adds it)
	$(VENV_BIN)/tfdist-launch --check

wheel:  ## dist/tfdist-<version>-py3-none-any.whl, what `pip install .` installs (needs no .venv)
	python3 -m pip wheel -q --no-deps --wheel-dir dist .
	rm -rf build tfdist.egg-info

horovod-conformance: setup  ## Horovod's own TF tests on our build, both Keras; HOROVOD_SRC=<horovod checkout at v0.28.1>
	@test -n "$(HOROVOD_SRC)" || { echo "set HOROVOD_SRC to a checkout of horovod/horovod at tag v0.28.1 (the sdist has no tests)"; exit 2; }
	PATH="$(CURDIR)/$(VENV_BIN):$$PATH" $(VENV_BIN)/python launch/horovod_conformance.py --horovod-src "$(HOROVOD_SRC)"

horovod-examples: setup  ## Horovod's examples/tensorflow2 unchanged through tfdist-launch, both Keras; HOROVOD_SRC as above
	@test -n "$(HOROVOD_SRC)" || { echo "set HOROVOD_SRC to a checkout of horovod/horovod at tag v0.28.1 (the sdist has no examples)"; exit 2; }
	PATH="$(CURDIR)/$(VENV_BIN):$$PATH" $(VENV_BIN)/python launch/horovod_examples.py --horovod-src "$(HOROVOD_SRC)"
