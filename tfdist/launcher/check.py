"""``tfdist-launch --check``: what is installed, like ``horovodrun --check-build``."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform
import shutil
import sys
from pathlib import Path
from typing import Any

from tfdist.core import flavour


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _existing(path: str) -> str | None:
    return path if os.path.exists(path) else None


def _horovod_report() -> dict[str, Any]:
    version = _version("horovod")
    if version is None:
        from tfdist.horovod.checks import INSTALL_FIX

        return {"installed": False, "fix": INSTALL_FIX}
    report: dict[str, Any] = {"installed": True, "version": version}
    try:
        importlib.import_module("horovod.tensorflow")
        from horovod.common import util

        report["tensorflow_ops"] = True
        report["controllers"] = {"gloo": util.gloo_built(), "mpi": util.mpi_built()}
        report["tensor_operations"] = {"nccl": util.nccl_built() > 0, "gloo": util.gloo_built()}
    except Exception as err:  # a broken build is exactly what --check is for
        report["tensorflow_ops"] = False
        report["error"] = f"{type(err).__name__}: {err}"
    beside_python = Path(sys.executable).parent / "horovodrun"
    report["horovodrun"] = shutil.which("horovodrun") or (
        str(beside_python) if beside_python.exists() else None
    )
    return report


def installed_report() -> dict[str, Any]:
    """Versions and capabilities of everything tfdist relies on.

    Example:
        >>> report = installed_report()
        >>> sorted(report)[:3]
        ['horovod', 'keras', 'machine']
    """
    import tensorflow as tf

    return {
        "tfdist": _version("tfdist"),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": {
            "keras": _version("keras"),
            "tf_keras": _version("tf-keras"),
            "tf.keras resolves to": flavour.keras_flavour(),
            flavour.LEGACY_KERAS_ENV: os.environ.get(flavour.LEGACY_KERAS_ENV),
        },
        "horovod": _horovod_report(),
        "multi-host tools": {
            "ssh (for --hosts)": shutil.which("ssh"),
            "sshd (multi-host tests)": shutil.which("sshd") or _existing("/usr/sbin/sshd"),
            "ip (multi-host tests)": shutil.which("ip") or _existing("/usr/sbin/ip"),
            "ray (for --ray)": _version("ray"),
        },
        "machine": {
            "cpus": os.cpu_count(),
            "gpus": len(tf.config.list_physical_devices("GPU")),
            "platform": platform.platform(),
        },
    }


def format_report(report: dict[str, Any], indent: int = 0) -> str:
    """Renders `installed_report` as indented ``key: value`` lines."""
    lines = []
    for key, value in report.items():
        if isinstance(value, dict):
            lines.append(f"{' ' * indent}{key}:")
            lines.append(format_report(value, indent + 2))
        else:
            lines.append(f"{' ' * indent}{key}: {value}")
    return "\n".join(lines)
