#!/usr/bin/env bash
# Set up (or refresh) the development environment in .venv/ at the repository root.
#
# Installs TensorFlow, tf-keras, the test tools and tfdist (editable), then Horovod 0.28.1
# compiled from source with TensorFlow and Gloo. Re-running is a quick no-op: every step checks
# whether its result is already in place. The Horovod wheel is cached outside the repository
# (TFDIST_CACHE_DIR, default ~/.cache/tfdist) so fresh clones on this machine skip the build.
#
# Environment:
#   TFDIST_PYTHON       interpreter to build the venv from (default: python3.11, then python3)
#   TFDIST_CACHE_DIR    where built wheels are kept (default: ~/.cache/tfdist)
#   TFDIST_SKIP_HOROVOD=1   do not install Horovod (its tests then skip with a reason)
#   TFDIST_BUILD_JOBS   parallel compile jobs for Horovod (default: number of cores)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
CACHE_DIR="${TFDIST_CACHE_DIR:-$HOME/.cache/tfdist}"
HOROVOD_VERSION="0.28.1"
# Bump when patch_horovod_source changes: cached wheels and installed builds of another level
# are rebuilt.
HOROVOD_PATCH_LEVEL="2"
TF_VERSION="2.21.0"
TF_KERAS_VERSION="2.21.0"  # tf-keras releases follow TensorFlow's

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
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

pick_python() {
  if [[ -n "${TFDIST_PYTHON:-}" ]]; then echo "$TFDIST_PYTHON"; return; fi
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then echo "$candidate"; return; fi
  done
  die "no python3 found. Install Python 3.11 (apt-get install python3 python3-venv) or set TFDIST_PYTHON."
}

# Installs the Debian packages named "command:package" whose command is missing (needs root).
apt_install_missing() {
  local missing=() pair
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || [[ -x "${pair%%:*}" ]] || missing+=("${pair##*:}")
  done
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

# System tools Horovod's build needs. Installed with apt-get when we are root, else named.
ensure_system_tools() {
  local missing
  if ! missing="$(apt_install_missing cmake:cmake g++:g++ make:make)"; then
    die "missing system tools: ${missing//$'\n'/ }. Install them (apt-get install ${missing//$'\n'/ }) or set TFDIST_SKIP_HOROVOD=1."
  fi
}

# What the multi-host tests use: ssh, sshd and ip (network namespaces). Optional: without them
# (not root) those tests skip and say why.
ensure_test_tools() {
  local missing
  if ! missing="$(apt_install_missing ssh:openssh-client ssh-keygen:openssh-client /usr/sbin/sshd:openssh-server ip:iproute2)"; then
    log "could not install ${missing//$'\n'/ } (needs root and apt-get): the multi-host tests will skip"
  fi
}

create_venv() {
  if [[ -x "$VENV/bin/python" ]]; then return; fi
  local py; py="$(pick_python)"
  log "creating $VENV with $($py --version 2>&1)"
  "$py" -m venv "$VENV" || die "could not create a venv with $py. On Debian: apt-get install python3-venv."
  pip_quiet install -q --upgrade pip setuptools wheel
}

# pip install -e . only when the package metadata (pyproject.toml) or the pins changed since the
# last successful run. pyproject.toml names supported ranges; the versions the project is tested
# with are pinned here.
install_python_deps() {
  local stamp="$VENV/.tfdist-deps.sha"
  local pins=("tensorflow==$TF_VERSION" "tf-keras==$TF_KERAS_VERSION")
  local want
  want="$({ cat "$ROOT/pyproject.toml"; printf '%s\n' "${pins[@]}"; } | sha256sum | cut -d' ' -f1)"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then return; fi
  log "installing ${pins[*]} and tfdist (editable, with its ray extra)"
  pip_quiet install -q -e "$ROOT[test,ray]" "${pins[@]}"
  echo "$want" > "$stamp"
}

horovod_installed() {
  [[ "$(cat "$VENV/.tfdist-horovod-build" 2>/dev/null)" == "$(horovod_build_key)" ]] || return 1
  "$VENV/bin/python" - "$HOROVOD_VERSION" <<'PY' >/dev/null 2>&1
import sys
import horovod
import horovod.tensorflow  # loads the compiled op library
from horovod.common.util import gloo_built
sys.exit(0 if horovod.__version__ == sys.argv[1] and gloo_built() else 1)
PY
}

# Two patches to Horovod 0.28.1's sdist:
# 1. horovod/tensorflow/xla_mpi_ops.cc includes tensorflow/compiler/xla/... headers that TF >= 2.16
#    wheels no longer ship. Its code is GPU-only (XLA ops, opt-in via HOROVOD_ENABLE_XLA_OPS), so
#    it is dropped from the build.
# 2. GlooContext::InitializeForProcessSet creates its Gloo device without the network interface
#    the global context was given (HOROVOD_GLOO_IFACE / horovodrun --network-interfaces), so it
#    binds to whatever the hostname resolves to; on hosts whose name maps to 127.0.1.1 (Debian's
#    default) multi-host jobs then fail with "Connection refused". It now inherits the interface.
patch_horovod_source() {
  local src="$1"
  local cmake="$src/horovod/tensorflow/CMakeLists.txt" gloo="$src/horovod/common/gloo/gloo_context.cc"
  sed -i '/xla_mpi_ops\.cc/d' "$cmake"
  grep -q xla_mpi_ops "$cmake" && die "patching $cmake failed"
  sed -i 's/^\(  assert(global_context.IsEnabled());\)$/\1\n  gloo_iface_ = global_context.gloo_iface_;  \/\/ tfdist patch/' "$gloo"
  grep -q "gloo_iface_ = global_context.gloo_iface_;" "$gloo" || die "patching $gloo failed"
  return 0
}

horovod_build_key() {
  local pyver; pyver="$("$VENV/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
  echo "horovod-$HOROVOD_VERSION-p$HOROVOD_PATCH_LEVEL-tf$TF_VERSION-$pyver-$(uname -m)-gloo"
}

build_horovod_wheel() {
  local out_dir="$1" work
  work="$(mktemp -d)"
  log "building Horovod $HOROVOD_VERSION from source (a few minutes on 2 cores)"
  pip_quiet download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work"
  tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
  patch_horovod_source "$work/horovod-$HOROVOD_VERSION"
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
  HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_GPU_OPERATIONS= \
  MAKEFLAGS="-j${TFDIST_BUILD_JOBS:-$(nproc)}" \
    "$VENV/bin/python" -m pip wheel -q --no-deps --no-build-isolation \
      -w "$work/dist" "$work/horovod-$HOROVOD_VERSION" > "$work/build.log" 2>&1 \
    || { tail -40 "$work/build.log" >&2; die "Horovod build failed (log above)"; }
  mkdir -p "$out_dir"
  cp "$work"/dist/horovod-*.whl "$out_dir/"
  rm -rf "$work"
}

install_horovod() {
  if [[ "${TFDIST_SKIP_HOROVOD:-0}" == "1" ]]; then log "TFDIST_SKIP_HOROVOD=1: not installing Horovod"; return; fi
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
  pip_quiet install -q cloudpickle psutil pyyaml packaging
  echo "$key" > "$VENV/.tfdist-horovod-build"
  horovod_installed || die "Horovod installed but does not import with Gloo; run: $VENV/bin/horovodrun --check-build"
}

main() {
  create_venv
  install_python_deps
  install_horovod
  ensure_test_tools
  log "ready: $VENV ($("$VENV/bin/python" -c 'import tensorflow as tf; print("tensorflow", tf.__version__)' 2>/dev/null))"
}

# Sourcing the file (tests do) defines the functions without running anything.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  main "$@"
fi
