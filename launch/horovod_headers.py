"""Finds standard headers Horovod's C++ sources use but get only through other standard headers.

Usage::

    python launch/horovod_headers.py SRC [FILE ...]

SRC is an unpacked Horovod sdist with tfdist's patches applied (``source launch/setup.sh &&
patch_horovod_source SRC``); FILEs (relative to SRC) default to everything the CPU build compiles
from ``horovod/common`` plus ``horovod/tensorflow/mpi_ops.cc``. Needs ``include-what-you-use``
(``apt-get install iwyu``).

A newer standard library (GCC 13's libstdc++ and later) includes fewer standard headers from its
own headers, so a file that names ``std::string`` with only ``<mutex>`` included stops compiling.
For each file, include-what-you-use says which standard headers it uses; a header counts as missing
when no ``#include`` in the file's own include closure (the file and the project and third-party
headers it includes, transitively, every ``#if`` branch taken) names it. Prints one line per missing
header and exits 1 if there is any.

Example::

    $ python launch/horovod_headers.py /tmp/horovod-0.28.1 horovod/common/group_table.h
    horovod/common/group_table.h: <string> (for string, basic_string, hash)
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# C names IWYU may suggest, and their C++ spelling (either include satisfies the use).
C_NAMES = {"stdint.h": "cstdint", "stddef.h": "cstddef", "assert.h": "cassert",
           "string.h": "cstring", "stdlib.h": "cstdlib", "limits.h": "climits",
           "errno.h": "cerrno", "time.h": "ctime", "math.h": "cmath", "stdio.h": "cstdio",
           "ctype.h": "cctype"}
# IWYU suggestions that are not real gaps: size_t alone (many standard headers declare it),
# std::pair credited to <iterator> and std::hash<std::string> to <string_view> (IWYU's mapping).
NOT_GAPS = {"size_t", "iterator: pair", "string_view: hash"}
# A header another one the file includes is bound to provide: durations are built on std::ratio,
# streams on std::basic_ostream, and containers take std::initializer_list.
IMPLIED_BY = {"ratio": {"chrono"}, "ostream": {"iostream", "sstream", "istream", "fstream"},
              "initializer_list": {"vector", "string", "map", "set", "unordered_map", "deque",
                                   "unordered_set", "list", "queue", "algorithm", "utility"}}
SKIP = re.compile(r"cuda|rocm|hip_|nccl|ddl|ccl_|gpu_|nvtx|_generated|adasum/adasum\.h")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
SUGGESTION = re.compile(r"#include <([^>/]+)>\s*(?://\s*for (.*))?")
TIMEOUT_S = 300


def default_files(src: Path) -> list[str]:
    """The CPU build's own C++ files: horovod/common (no GPU backends) and the TF op library."""
    common = sorted(p.relative_to(src).as_posix() for p in (src / "horovod/common").rglob("*")
                    if p.suffix in (".cc", ".h") and not SKIP.search(p.as_posix()))
    if shutil.which("mpicxx") is None:
        common = [f for f in common if "mpi" not in f]
    return common + ["horovod/tensorflow/mpi_ops.cc"]


def include_dirs(src: Path, generated: Path) -> list[Path]:
    """Where the build looks for headers (CMakeLists.txt's include_directories)."""
    third = src / "third_party"
    dirs = [src, generated, third / "gloo", third / "eigen", third / "flatbuffers/include",
            third / "lbfgs/include", third / "HTTPRequest/include"]
    dirs += sorted(third.glob("boost/*/include"))
    if shutil.which("mpicxx"):
        out = subprocess.run(["mpicxx", "--showme:incdirs"], capture_output=True, text=True,
                             check=True, timeout=TIMEOUT_S).stdout
        dirs += [Path(d) for d in out.split()]
    return dirs


def tensorflow_include() -> list[Path]:
    """TensorFlow's headers, for horovod/tensorflow (importing TF takes seconds: only then)."""
    try:
        import tensorflow as tf  # noqa: PLC0415
    except ImportError as err:
        raise SystemExit("horovod/tensorflow needs TensorFlow's headers: pip install "
                         "tensorflow, or name only horovod/common files") from err
    return [Path(tf.sysconfig.get_include())]


def write_gloo_config(src: Path, generated: Path) -> None:
    """gloo/config.h as CMake writes it for a TCP (and MPI, if present) build."""
    text = (src / "third_party/gloo/gloo/config.h.in").read_text()
    text = re.sub(r"@GLOO_VERSION_(MAJOR|MINOR|PATCH)@", "0", text)
    on = {"GLOO_HAVE_TRANSPORT_TCP"} | ({"GLOO_USE_MPI"} if shutil.which("mpicxx") else set())
    text = re.sub(r"#cmakedefine01 (\w+)",
                  lambda m: f"#define {m.group(1)} {int(m.group(1) in on)}", text)
    (generated / "gloo").mkdir(parents=True, exist_ok=True)
    (generated / "gloo/config.h").write_text(text)


def suggested(src: Path, file: str, dirs: list[Path]) -> dict[str, str]:
    """The standard headers IWYU says FILE should add, each with the names it is for."""
    # As the build defines them (TensorFlow's compile flags among them).
    defines = ["-DHAVE_GLOO=1", "-DEIGEN_MPL2_ONLY=1", "-D_GLIBCXX_USE_CXX11_ABI=1",
               "-DEIGEN_MAX_ALIGN_BYTES=64", "-DTENSORFLOW_VERSION=2021000000"]
    if shutil.which("mpicxx"):
        defines.append("-DHAVE_MPI=1")
    cmd = (["include-what-you-use", "-std=c++17", "-x", "c++", "-w", "-Xiwyu", "--no_fwd_decls"]
           + defines + [f"-I{d}" for d in dirs] + [file])
    out = subprocess.run(cmd, cwd=src, capture_output=True, text=True, timeout=TIMEOUT_S)
    if re.search(r": (fatal )?error:", out.stderr):
        raise RuntimeError(f"include-what-you-use could not parse {file}:\n{out.stderr[-2000:]}")
    section = out.stderr.split(f"{file} should add these lines:", 1)
    if len(section) < 2:  # "(FILE has correct #includes/fwd-decls)"
        return {}
    found = {}
    for line in section[1].split("should remove these lines:", 1)[0].splitlines():
        match = SUGGESTION.match(line)
        if match and ("." not in match.group(1) or match.group(1) in C_NAMES):
            found[C_NAMES.get(match.group(1), match.group(1))] = (match.group(2) or "").strip()
    return found


def explicit_std_includes(path: Path, dirs: list[Path], seen: set[Path] | None = None) -> set[str]:
    """Standard headers named by an #include in PATH or any non-standard header it includes."""
    seen = set() if seen is None else seen
    if path in seen:
        return set()
    seen.add(path)
    names: set[str] = set()
    for line in path.read_text(errors="replace").splitlines():
        match = INCLUDE.match(line)
        if not match:
            continue
        found = next((d / match.group(2) for d in [path.parent, *dirs]
                      if (d / match.group(2)).is_file()), None)
        if found is not None:
            names |= explicit_std_includes(found.resolve(), dirs, seen)
        elif match.group(1) == "<":
            names.add(C_NAMES.get(match.group(2), match.group(2)))
    return names


def missing_headers(src: Path, files: list[str]) -> list[tuple[str, str, str]]:
    """(file, header, names) for each standard header a file uses but only gets transitively."""
    gaps = []
    with tempfile.TemporaryDirectory() as generated:
        write_gloo_config(src, Path(generated))
        common = include_dirs(src, Path(generated))
        # TensorFlow's files build against TF's headers first, its Eigen not Horovod's copy.
        tf_dirs = (tensorflow_include() + [d for d in common if d.name != "eigen"]
                   if any(f.startswith("horovod/tensorflow/") for f in files) else [])
        for file in files:
            dirs = tf_dirs if file.startswith("horovod/tensorflow/") else common
            have = explicit_std_includes((src / file).resolve(), dirs)
            for header, names in suggested(src, file, dirs).items():
                if (header in have or IMPLIED_BY.get(header, set()) & have
                        or {names, f"{header}: {names}"} & NOT_GAPS):
                    continue
                gaps.append((file, header, names))
    return gaps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path, help="an unpacked, patched Horovod sdist")
    parser.add_argument("files", nargs="*", help="files relative to SRC (default: the CPU build's)")
    args = parser.parse_args(argv)
    if shutil.which("include-what-you-use") is None:
        parser.error("include-what-you-use is not installed. Fix: apt-get install iwyu")
    if not (args.src / "horovod/common").is_dir():
        parser.error(f"src={args.src} is not an unpacked Horovod sdist (no horovod/common). "
                     "Fix: tar -xzf horovod-0.28.1.tar.gz and pass horovod-0.28.1/")
    gaps = missing_headers(args.src, args.files or default_files(args.src))
    for file, header, names in gaps:
        print(f"{file}: <{header}> (for {names})")
    return 1 if gaps else 0


if __name__ == "__main__":
    sys.exit(main())
