#!/usr/bin/env bash
# Set up (or refresh) the development environment in .venv/ at the repository root.
#
# Installs TensorFlow, tf-keras, the test tools and tfdist (editable), then Horovod 0.28.1
# compiled from source with TensorFlow, Gloo and (where OpenMPI installs) MPI. Re-running is a quick no-op: every step checks
# whether its result is already in place. The Horovod wheel is cached outside the repository
# (TFDIST_CACHE_DIR, default ~/.cache/tfdist) so fresh clones on this machine skip the build.
#
# Options:
#   --minimal           only what a job without Horovod needs (make main): no Horovod, OpenMPI,
#                       keras-hub or multi-host test tools. A later run without it adds them (make horovod,
#                       make test), Horovod from the cached wheel when there is one
#   --with-slurm        also install Slurm (slurmctld, slurmd, slurm-client) and munge with apt,
#                       for the tests that submit jobs to a private Slurm cluster (make slurm)
#   --horovod-wheel DIR only build the patched Horovod wheel into DIR with the venv's TensorFlow
#                       (neither cached nor installed): to try a toolchain, e.g. a newer cmake first
#                       on PATH: bash launch/setup.sh --horovod-wheel /tmp/hvd-wheel
#
# Environment:
#   TFDIST_VENV         the venv to set up or build with (default: .venv at the repository root)
#   TFDIST_PYTHON       interpreter to build the venv from (default: python3.11, then python3)
#   TFDIST_CACHE_DIR    where built wheels are kept (default: ~/.cache/tfdist)
#   TFDIST_SKIP_HOROVOD=1   do not install Horovod (its tests then skip with a reason)
#   TFDIST_INSTALLER=pip    install the Python packages with pip alone (default: uv, pip where
#                       uv cannot; see venv_install)
#   TFDIST_BUILD_JOBS   parallel compile jobs for Horovod (default: number of cores)
#   TFDIST_PROGRESS_SECONDS  how often a long step (the Horovod build) says how far it is (default 30)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TFDIST_VENV:-$ROOT/.venv}"
CACHE_DIR="${TFDIST_CACHE_DIR:-$HOME/.cache/tfdist}"
HOROVOD_VERSION="0.28.1"
HOROVOD_PATCHES="$ROOT/launch/horovod-patches"
TF_VERSION="2.21.0"
TF_KERAS_VERSION="2.21.0"  # tf-keras releases follow TensorFlow's
TENSORBOARD_VERSION="2.21.0"  # so do tensorboard's; TF 2.21 no longer installs it
KERAS_HUB_VERSION="0.32.0"  # the tensor tests' KerasHub models (built from configs, no download)
UV_VERSION="0.13.9"  # what installs the Python packages into the venv (venv_install)

# Runs pip with its output kept in a log, shown only if pip fails.
pip_quiet() {
  local log; log="$(mktemp)"
  if ! "$VENV/bin/python" -m pip "$@" >"$log" 2>&1; then
    grep -v "^WARNING: Location 'file:" "$log" | tail -40 >&2
    rm -f "$log"
    die "pip $* failed (output above)"
  fi
  rm -f "$log"
}

log() { printf '[setup] %s\n' "$*" >&2; }

# Installs Python packages into the venv (pip install's arguments) with uv, which unpacks and
# compiles them in parallel and links them from its cache: TensorFlow and the extras in 15-19 s
# on 2 cores, against pip's 42 s (most of a set-up's time when Horovod's wheel is cached). uv reads
# no pip configuration: it is given the index pip uses instead of PyPI, if any (a mirror), and
# where it fails all the same (an extra index only pip knows of) pip does the same install over.
venv_install() {
  if use_uv; then
    local log index; log="$(mktemp)"
    index="${PIP_INDEX_URL:-$("$VENV/bin/python" -m pip config get global.index-url 2>/dev/null || true)}"
    if "$VENV/bin/uv" pip install --python "$VENV/bin/python" --compile-bytecode \
         ${index:+--index-url "$index"} "$@" >"$log" 2>&1; then
      rm -f "$log"
      return
    fi
    log "uv could not install them ($(grep -v '^ *$' "$log" | tail -1)); pip will (TFDIST_INSTALLER=pip skips uv)"
    rm -f "$log"
  fi
  pip_quiet install "$@"
}

# True when uv is in the venv, installed there by pip the first time (1 s); false with
# TFDIST_INSTALLER=pip, or where pip cannot install it (said once).
use_uv() {
  [[ "${TFDIST_INSTALLER:-uv}" == "uv" ]] || return 1
  [[ -x "$VENV/bin/uv" ]] && return 0
  "$VENV/bin/python" -m pip install -q "uv==$UV_VERSION" >/dev/null 2>&1 && [[ -x "$VENV/bin/uv" ]] \
    && return 0
  log "could not install uv $UV_VERSION with pip: pip installs the packages (slower)"
  TFDIST_INSTALLER=pip
  return 1
}

# Runs "$@" with its output in LOG; every TFDIST_PROGRESS_SECONDS prints LABEL, the time so far
# and the command's latest CMake step ("[ 45%]"), so a build of minutes is not silent. Returns
# the command's exit status.
run_with_progress() {
  local label="$1" log="$2" every="${TFDIST_PROGRESS_SECONDS:-30}" pid step waited=0
  shift 2
  # Its own process group, so that set-up interrupted or terminated stops the whole build
  # (pip, cmake, make, the compilers) rather than leave it running.
  setsid "$@" >"$log" 2>&1 &
  pid=$!
  # shellcheck disable=SC2064  # the pid is known now, not when the trap runs
  trap "kill -- -$pid 2>/dev/null; exit 130" INT
  # shellcheck disable=SC2064
  trap "kill -- -$pid 2>/dev/null; exit 143" TERM
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    waited=$((waited + 1))
    if (( waited % every == 0 )); then
      step="$(grep -o '\[ *[0-9]*%\]' "$log" | tail -1 || true)"
      log "$label: $((waited / 60))m$((waited % 60))s${step:+, at $step}"
    fi
  done
  trap - INT TERM
  wait "$pid"
}
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

pick_python() {
  if [[ -n "${TFDIST_PYTHON:-}" ]]; then echo "$TFDIST_PYTHON"; return; fi
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then echo "$candidate"; return; fi
  done
  die "no python3 found. Install Python 3.11 (apt-get install python3 python3-venv) or set TFDIST_PYTHON."
}

# The system packages each step needs, as "command:package" pairs (a package is missing when
# its command is neither on PATH nor an executable path).
BUILD_PACKAGES=(cmake:cmake g++:g++ make:make)
PATCH_PACKAGES=(patch:patch)
MPI_PACKAGES=(mpicxx:libopenmpi-dev mpirun:openmpi-bin)
TEST_TOOL_PACKAGES=(ssh:openssh-client ssh-keygen:openssh-client /usr/sbin/sshd:openssh-server
                    ip:iproute2 include-what-you-use:iwyu)
SLURM_PACKAGES=(/usr/sbin/munged:munge /usr/sbin/slurmctld:slurmctld /usr/sbin/slurmd:slurmd
                sbatch:slurm-client)

# Prints the package of each "command:package" pair whose command is missing, one a line.
missing_packages() {
  local pair
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || [[ -x "${pair%%:*}" ]] || echo "${pair##*:}"
  done
}

# Installs the Debian packages named "command:package" whose command is missing (needs root).
apt_install_missing() {
  local missing=()
  mapfile -t missing < <(missing_packages "$@")
  [[ ${#missing[@]} -eq 0 ]] && return 0
  if [[ "$(id -u)" != "0" ]] || ! command -v apt-get >/dev/null 2>&1; then
    printf '%s\n' "${missing[@]}"
    return 1
  fi
  log "installing system packages: ${missing[*]}"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
           --no-install-recommends "${missing[@]}" >/dev/null; }; then
    printf '%s\n' "${missing[@]}"
    return 1
  fi
}

# The "command:package" pairs of every system package a full set-up (not --minimal) installs.
system_package_pairs() {
  local with_slurm="$1"
  if [[ "${TFDIST_SKIP_HOROVOD:-0}" != "1" ]]; then
    echo "${BUILD_PACKAGES[@]}" "${PATCH_PACKAGES[@]}" "${MPI_PACKAGES[@]}"
  fi
  echo "${TEST_TOOL_PACKAGES[@]}"
  if [[ "$with_slurm" == "1" ]]; then echo "${SLURM_PACKAGES[@]}"; fi
}

# On a fresh machine apt-get installs the system packages (Slurm, OpenMPI, IWYU, ...) in the
# background while pip installs TensorFlow: one `apt-get update` and one install instead of one
# of each per group, after pip. wait_for_system_packages joins it before anything needs them;
# the ensure_* steps after it then find their commands, or (if this one install failed, e.g. on a
# package the distribution lacks) try their own group as before and say what is missing.
SYSTEM_PACKAGES_PID=""
SYSTEM_PACKAGES_LOG=""
start_system_packages() {
  local missing=()
  # shellcheck disable=SC2046  # one word per pair
  mapfile -t missing < <(missing_packages $(system_package_pairs "$1"))
  [[ ${#missing[@]} -eq 0 ]] && return 0
  [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1 || return 0
  SYSTEM_PACKAGES_LOG="$(mktemp)"
  log "installing system packages in the background: $(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends "${missing[@]}"; } >"$SYSTEM_PACKAGES_LOG" 2>&1 &
  SYSTEM_PACKAGES_PID=$!
  # Set-up stopped early (a pip failure, Ctrl-C) still waits for apt-get: stopped mid-install,
  # dpkg would be left half-configured.
  trap wait_for_system_packages EXIT
}

wait_for_system_packages() {
  [[ -n "$SYSTEM_PACKAGES_PID" ]] || return 0
  if ! wait "$SYSTEM_PACKAGES_PID"; then
    log "installing the system packages together failed; each group is tried alone next. apt-get said:"
    tail -5 "$SYSTEM_PACKAGES_LOG" >&2
  fi
  rm -f "$SYSTEM_PACKAGES_LOG"
  SYSTEM_PACKAGES_PID=""
}

# System tools Horovod's build needs. Installed with apt-get when we are root, else named.
ensure_system_tools() {
  local missing
  if ! missing="$(apt_install_missing "${BUILD_PACKAGES[@]}")"; then
    die "missing system tools: ${missing//$'\n'/ }. Install them (apt-get install ${missing//$'\n'/ }) or set TFDIST_SKIP_HOROVOD=1."
  fi
}

# OpenMPI, for Horovod's MPI controller (tfdist-launch --mpi). Optional: without it Horovod is
# built with Gloo alone and the MPI tests skip.
ensure_mpi() {
  local missing
  if ! missing="$(apt_install_missing "${MPI_PACKAGES[@]}")"; then
    log "could not install ${missing//$'\n'/ } (needs root and apt-get): Horovod is built without MPI"
  fi
}

# The controllers Horovod is built with: Gloo always, MPI where OpenMPI's compiler wrapper is.
horovod_controllers() {
  if command -v mpicxx >/dev/null 2>&1; then echo "gloo-mpi"; else echo "gloo"; fi
}

# What the multi-host tests use: ssh, sshd and ip (network namespaces); include-what-you-use for
# the check of Horovod's standard headers (launch/horovod_headers.py). Optional: without them
# (not root) those tests skip and say why.
ensure_test_tools() {
  local missing
  if ! missing="$(apt_install_missing "${TEST_TOOL_PACKAGES[@]}")"; then
    log "could not install ${missing//$'\n'/ } (needs root and apt-get): the multi-host and header-check tests will skip"
  fi
}

# Slurm and munge, for tests/slurm (optional: without them, or without root, those tests skip).
ensure_slurm_tools() {
  local missing
  if ! missing="$(apt_install_missing "${SLURM_PACKAGES[@]}")"; then
    log "could not install ${missing//$'\n'/ } (needs root and apt-get): the Slurm tests will skip"
  fi
}

create_venv() {
  if [[ -x "$VENV/bin/python" ]]; then return; fi
  local py; py="$(pick_python)"
  log "creating $VENV with $($py --version 2>&1)"
  "$py" -m venv "$VENV" || die "could not create a venv with $py. On Debian: apt-get install python3-venv."
  venv_install -q --upgrade pip setuptools wheel
}

# pip install -e . only when the package metadata (pyproject.toml) or the pins changed since the
# last successful run. pyproject.toml names supported ranges; the versions the project is tested
# with are pinned here.
install_python_deps() {
  local stamp="$VENV/.tfdist-deps.sha"
  local pins=("tensorflow==$TF_VERSION" "tf-keras==$TF_KERAS_VERSION" "tensorboard==$TENSORBOARD_VERSION")
  local want
  want="$({ cat "$ROOT/pyproject.toml"; printf '%s\n' "${pins[@]}"; } | sha256sum | cut -d' ' -f1)"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then return; fi
  log "installing ${pins[*]} and tfdist (editable, with its test, ray and docs extras)"
  venv_install -q -e "$ROOT[test,ray,docs]" "${pins[@]}"
  echo "$want" > "$stamp"
}

# KerasHub, for the tests that split its models: without its declared tensorflow-text (not needed
# to build models from configs), so --no-deps and its other needs named.
install_keras_hub() {
  local stamp="$VENV/.tfdist-keras-hub" want="keras-hub==$KERAS_HUB_VERSION kagglesdk==0.1.28"
  if [[ "$(cat "$stamp" 2>/dev/null)" == "$want" ]]; then return; fi
  if "$VENV/bin/python" -c "from importlib.metadata import version as v
import sys; sys.exit(v('keras-hub') != '$KERAS_HUB_VERSION')" 2>/dev/null; then
    echo "$want" > "$stamp"  # installed before this step existed
    return
  fi
  log "installing keras-hub $KERAS_HUB_VERSION (without tensorflow-text)"
  venv_install -q --no-deps "keras-hub==$KERAS_HUB_VERSION" regex kagglehub \
    kagglesdk==0.1.28 tqdm rich markdown-it-py mdurl pygments tokenizers sentencepiece \
    huggingface-hub fsspec filelock
  echo "$want" > "$stamp"
}

# The import check loads TensorFlow (~9 s): a re-run skips it while the build key and the
# installed TensorFlow and Horovod versions are those it last passed with.
horovod_installed() {
  local key state verified="$VENV/.tfdist-horovod-verified"
  key="$(horovod_build_key)"
  [[ "$(cat "$VENV/.tfdist-horovod-build" 2>/dev/null)" == "$key" ]] || return 1
  state="$key $("$VENV/bin/python" -c 'from importlib.metadata import version as v
print(v("tensorflow"), v("horovod"))' 2>/dev/null)"
  [[ "$(cat "$verified" 2>/dev/null)" == "$state" ]] && return 0
  "$VENV/bin/python" - "$HOROVOD_VERSION" "$(horovod_controllers)" <<'PY' >/dev/null 2>&1 || return 1
import sys
import horovod
import horovod.tensorflow  # loads the compiled op library
from horovod.common.util import gloo_built, mpi_built
want_mpi = sys.argv[2].endswith("-mpi")
sys.exit(0 if horovod.__version__ == sys.argv[1] and gloo_built() and mpi_built() == want_mpi else 1)
PY
  echo "$state" > "$verified"
}

# Applies launch/horovod-patches/*.patch (each says what it fixes) to the unpacked sdist.
patch_horovod_source() {
  local src="$1" patch_file
  apt_install_missing "${PATCH_PACKAGES[@]}" >/dev/null \
    || die "the 'patch' tool is missing. Install it (apt-get install patch) or set TFDIST_SKIP_HOROVOD=1."
  for patch_file in "$HOROVOD_PATCHES"/*.patch; do
    patch -d "$src" -p1 --forward --quiet < "$patch_file" >/dev/null \
      || die "applying $(basename "$patch_file") to Horovod $HOROVOD_VERSION failed"
  done
}

# Identifies the patch set: any edit to a patch gives a new build key and so a rebuild.
horovod_patches_hash() {
  cat "$HOROVOD_PATCHES"/*.patch | sha256sum | cut -c1-12
}

horovod_build_key() {
  local pyver; pyver="$("$VENV/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
  echo "horovod-$HOROVOD_VERSION-p$(horovod_patches_hash)-tf$TF_VERSION-$pyver-$(uname -m)-$(horovod_controllers)"
}

# Prints a failed build's first compiler or CMake errors with the lines that explain them (CMake
# says why on the next lines, g++ shows the code), else pip's last error lines.
show_first_errors() {
  local log="$1" first
  first="$(grep -E -m3 -A3 ': (fatal )?error:|CMake Error' "$log" || true)"
  [[ -n "$first" ]] || first="$(grep -E 'error|Error|ERROR' "$log" | grep -v '^ *-' | tail -5 || true)"
  printf '%s\n' "$first" | head -16 >&2
}

build_horovod_wheel() {
  local out_dir="$1" work build_log="$CACHE_DIR/logs/horovod-build.log"
  work="$(mktemp -d)"
  mkdir -p "$(dirname "$build_log")"
  log "building Horovod $HOROVOD_VERSION from source (2-5 minutes on 2 cores); log: $build_log"
  local sdist="$CACHE_DIR/sdist/horovod-$HOROVOD_VERSION.tar.gz"
  [[ -f "$sdist" ]] || pip_quiet download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$(dirname "$sdist")"
  tar -xzf "$sdist" -C "$work"
  patch_horovod_source "$work/horovod-$HOROVOD_VERSION"
  local mpi=HOROVOD_WITHOUT_MPI
  [[ "$(horovod_controllers)" == *-mpi ]] && mpi=HOROVOD_WITH_MPI
  if ! ( export "$mpi=1"
         HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
         HOROVOD_WITH_GLOO=1 HOROVOD_GPU_OPERATIONS= MAKEFLAGS="-j${TFDIST_BUILD_JOBS:-$(nproc)}" \
           run_with_progress "building Horovod" "$build_log" \
             "$VENV/bin/python" -m pip wheel -v --no-deps --no-build-isolation \
               -w "$work/dist" "$work/horovod-$HOROVOD_VERSION" ); then
    rm -rf "$work"
    show_first_errors "$build_log"
    die "Horovod build failed ($(cmake --version | head -1), $(g++ --version | head -1)). Full log: $build_log (first errors above). Set TFDIST_SKIP_HOROVOD=1 to set up without Horovod."
  fi
  mkdir -p "$out_dir"
  cp "$work"/dist/horovod-*.whl "$out_dir/"
  rm -rf "$work"
}

install_horovod() {
  if [[ "${TFDIST_SKIP_HOROVOD:-0}" == "1" ]]; then log "TFDIST_SKIP_HOROVOD=1: not installing Horovod"; return; fi
  ensure_mpi
  if horovod_installed; then return; fi
  ensure_system_tools
  # A wheel is only valid for the TF, Python and patches it was compiled with.
  local key; key="$(horovod_build_key)"
  local wheel_dir="$CACHE_DIR/wheels/$key"
  if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
    build_horovod_wheel "$wheel_dir"
  else
    log "using cached Horovod wheel from $wheel_dir"
  fi
  pip_quiet install -q --no-deps --force-reinstall "$wheel_dir"/horovod-*.whl
  # Horovod's runtime dependencies (horovodrun), installed apart so pip does not rebuild it.
  venv_install -q cloudpickle psutil pyyaml packaging
  echo "$key" > "$VENV/.tfdist-horovod-build"
  horovod_installed || die "Horovod installed but does not import with Gloo; run: $VENV/bin/horovodrun --check-build"
}

# --horovod-wheel DIR: the build alone, into DIR, with an existing venv that has TensorFlow.
build_horovod_wheel_only() {
  local out_dir="$1"
  [[ -n "$out_dir" ]] || die "--horovod-wheel needs a directory: bash launch/setup.sh --horovod-wheel DIR"
  "$VENV/bin/python" -c 'import tensorflow' 2>/dev/null \
    || die "--horovod-wheel builds against the venv's TensorFlow, but $VENV has none. Run bash launch/setup.sh first or set TFDIST_VENV."
  ensure_system_tools
  log "toolchain: $(cmake --version | head -1), $(g++ --version | head -1)"
  build_horovod_wheel "$out_dir"
  log "built $(ls "$out_dir"/horovod-*.whl)"
}

main() {
  local with_slurm=0 minimal=0
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --with-slurm) with_slurm=1 ;;
      --minimal) minimal=1 ;;
      --horovod-wheel) build_horovod_wheel_only "${2:-}"; return ;;
      *) die "unknown option $1 (known: --minimal, --with-slurm, --horovod-wheel DIR)" ;;
    esac
    shift
  done
  [[ "$minimal" == "1" ]] || start_system_packages "$with_slurm"
  create_venv
  install_python_deps
  if [[ "$minimal" == "1" ]]; then
    "$VENV/bin/python" -c 'import horovod' >/dev/null 2>&1 \
      || log "--minimal: Horovod not installed; make horovod (bash launch/setup.sh) adds it"
  else
    install_keras_hub
    wait_for_system_packages
    install_horovod
    ensure_test_tools
  fi
  if [[ "$with_slurm" == "1" ]]; then ensure_slurm_tools; fi
  log "ready: $VENV ($("$VENV/bin/python" -c 'from importlib.metadata import version
print("tensorflow", version("tensorflow"))' 2>/dev/null))"
}

# Sourcing the file (tests do) defines the functions without running anything.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  main "$@"
fi
