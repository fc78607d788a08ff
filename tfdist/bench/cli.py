"""``tfdist-bench`` / ``python -m tfdist.bench``: run benchmark sections, write JSON, tables, plot.

Example:
    >>> args = parse_args(["allreduce", "--quick", "--np", "2"])
    >>> args.sections, configs(args)["allreduce"].repeats
    (['allreduce'], 1)
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tfdist.bench import advise, pipeline, ps, report, tensor, train, zero
from tfdist.probe import allreduce
from tfdist.probe.common import THREADS_ENV
from tfdist.probe.machine import machine, machine_note

__all__ = ["SECTIONS", "parse_args", "configs", "run", "main"]

SECTIONS = {"allreduce": allreduce.run, "train": train.run, "ps": ps.run,
            "pipeline": pipeline.run, "tensor": tensor.run, "advise": advise.run,
            "zero": zero.run}
STANDALONE = frozenset({"advise", "tensor", "zero"})
"""Sections ``all`` leaves out: ``advise`` re-runs the others' kinds of jobs (minutes);
``tensor`` runs four Transformer jobs (minutes on 2 cores); ``zero`` two jobs of stages 0-3."""


def _env_pair(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, received {text!r}")
    key, value = text.split("=", 1)
    return key, value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses ``argv`` (``sys.argv[1:]`` when None); ``sections`` lists what to run."""
    parser = argparse.ArgumentParser(prog="tfdist-bench", description=__doc__.splitlines()[0])
    parser.add_argument("section", nargs="?", default="all", choices=[*SECTIONS, "all"],
                        help="what to run (default: all)")
    run = parser.add_argument_group("run")
    run.add_argument("--quick", action="store_true",
                     help="3 sizes, 1 repeat, tiny training: every code path once, a smoke run, "
                     "not a measurement")
    run.add_argument("--out", type=Path, default=Path("bench_results"),
                     help="output folder (default: bench_results/)")
    run.add_argument("--np", type=int, default=2, help="processes / replicas (default 2)")
    run.add_argument("--repeats", type=int, help="timed repeats per point (section default)")
    run.add_argument("--threads", metavar="INTER,INTRA",
                     help=f"TF thread pools of every child (sets {THREADS_ENV})")
    run.add_argument("--env", type=_env_pair, action="append", default=[], metavar="KEY=VALUE",
                     help="extra environment for every child, e.g. HOROVOD_CYCLE_TIME=0.1")
    run.add_argument("--tag", default="", help="appended to the output file names")
    run.add_argument("--dry-run", action="store_true", help="print the configuration and stop")
    comm = parser.add_argument_group("collectives")
    comm.add_argument("--sizes", type=lambda s: [int(v) for v in s.split(",")],
                      help="allreduce message sizes in bytes (default 4 KiB..64 MiB, x4)")
    comm.add_argument("--backends", default="tf,horovod,horovod-mpi",
                      help="allreduce backends (tf, horovod = Gloo, horovod-mpi)")
    comm.add_argument("--implementation", default="ring", choices=("ring", "auto"),
                      help="TF collective implementation")
    comm.add_argument("--bytes-per-pack", type=int, default=0, help="TF gradient pack size")
    comm.add_argument("--compression", default="none", choices=("none", "fp16"),
                      help="allreduce: Horovod compression")
    training = parser.add_argument_group("train / ps")
    training.add_argument("--steps", type=int, help="steps per timed fit (section default)")
    training.add_argument("--strategies", default="default,multi_worker,horovod")
    training.add_argument("--num-ps", default="1,2", help="ps section: ps counts")
    training.add_argument("--constants", help="advise section: network constants JSON to reuse "
                          "(tfdist-advise --probe-only) instead of probing")
    training.add_argument("--budget", type=float, metavar="SECONDS",
                          help="advise section: no job starts after this many seconds (the "
                          "table notes what was skipped; default with --quick: "
                          f"{advise.QUICK_BUDGET_S:g}, else none)")
    training.add_argument("--examples", default=",".join(advise.EXAMPLE_NAMES),
                          help="advise section: which examples (default: "
                          f"{','.join(advise.EXAMPLE_NAMES)})")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.examples.split(",")) - set(advise.EXAMPLE_NAMES))
    if unknown:
        parser.error(f"--examples: unknown {unknown}; expected some of {advise.EXAMPLE_NAMES}")
    args.sections = ([s for s in SECTIONS if s not in STANDALONE] if args.section == "all"
                     else [args.section])
    return args


def _common_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(args.env)
    if args.threads:
        env[THREADS_ENV] = args.threads
    return env


def configs(args: argparse.Namespace) -> dict[str, Any]:
    """The config of each section, from the defaults, ``--quick`` and explicit flags."""
    env, quick = _common_env(args), args.quick
    pick = lambda given, full, fast: given if given is not None else (fast if quick else full)  # noqa: E731
    return {
        "allreduce": allreduce.AllreduceConfig(
            np=args.np, sizes=args.sizes or allreduce.default_sizes(quick),
            warmup=1 if quick else 2, repeats=pick(args.repeats, 7, 1),
            backends=tuple(args.backends.split(",")), implementation=args.implementation,
            bytes_per_pack=args.bytes_per_pack, compression=args.compression, env=env),
        "train": train.TrainConfig(
            np=args.np, quick=quick, steps=pick(args.steps, 400, 10),
            warmup_steps=2 if quick else 20, repeats=pick(args.repeats, 7, 1),
            implementation=args.implementation, bytes_per_pack=args.bytes_per_pack,
            strategies=tuple(args.strategies.split(",")), env=env,
            mw_job_pairs=1 if quick else 2),
        "ps": ps.PsConfig(
            workers=args.np, quick=quick, num_ps=tuple(int(p) for p in args.num_ps.split(",")),
            steps=pick(args.steps, 100, 10), warmup_steps=10 if quick else 20,
            repeats=pick(args.repeats, 3, 1), env=env),
        "pipeline": pipeline.PipelineConfig(quick=quick, steps=pick(args.steps, 20, 3), env=env),
        "tensor": tensor.TensorBenchConfig(quick=quick, shards=args.np,
                                           steps=pick(args.steps, 10, 3), env=env),
        "zero": zero.ZeroBenchConfig(quick=quick, np=args.np, steps=pick(args.steps, 10, 3),
                                     env=env),
        "advise": advise.AdviseBenchConfig(np=args.np, quick=quick, steps=pick(args.steps, 40, 20),
                                           repeats=pick(args.repeats, 5, 3),
                                           constants=args.constants, env=env,
                                           budget_s=args.budget,
                                           only=tuple(args.examples.split(","))),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Runs the sections; writes ``<stem>.json``, ``.md``, ``.log`` and the plot in ``--out``."""
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    stem = "-".join(p for p in ("bench", stamp, "quick" if args.quick else "", args.tag) if p)
    result: dict[str, Any] = {"machine": machine(), "quick": args.quick,
                              "argv": sys.argv[1:], "seconds": {}}
    chosen = configs(args)
    with open(args.out / f"{stem}.log", "w") as log:
        for section in args.sections:
            start = time.monotonic()
            print(f"[tfdist-bench] {section} ...", flush=True)
            result[section] = SECTIONS[section](chosen[section], log)
            result["seconds"][section] = round(time.monotonic() - start, 1)
    result["files"] = {"json": str(report.write_json(result, args.out, stem))}
    if "allreduce" in result:
        png = report.plot_allreduce(result["allreduce"], args.out, stem,
                                    machine_note(result["machine"]))
        result["files"]["plot"] = str(png) if png else "(no matplotlib: pip install tfdist[bench])"
    text = report.tables(result)
    (args.out / f"{stem}.md").write_text(text + "\n")
    report.write_json(result, args.out, stem)
    print(text)
    print(f"\n[tfdist-bench] wrote {', '.join(result['files'].values())} "
          f"({sum(result['seconds'].values()):.0f} s)")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        for section in args.sections:
            print(f"{section}: {configs(args)[section]}")
        return 0
    run(args)
    return 0
