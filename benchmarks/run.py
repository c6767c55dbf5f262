"""Run mdata's benchmarks and print figures side by side with the baseline.

    python benchmarks/run.py [--quick] [--only NAME ...] [--json PATH]

Each benchmark module in this folder exposes ``run(quick: bool) -> dict`` (see harness.py). A
module that cannot run here (a missing optional peer, say) is reported as not measured, never
given invented numbers.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.harness import flatten, render_table  # noqa: E402

#: A benchmark whose module name differs from the name ``--only`` takes.
MODULES = {"control": "control_plane"}

# Order matters only for reading the table: cheap, pure figures first.
BENCHMARKS = ["plan", "transforms", "balance", "planner", "lineage", "mixture", "resume",
              "comms", "control", "throughput", "memory", "reliability", "e2e", "pools",
              "convergence"]


def _quiet_logs() -> None:
    """Keep INFO chatter out of the table: Dask's (which logs a closed comm during a cluster's
    shutdown at INFO *with* its traceback) and the local S3 server's access log. Warnings and
    errors still print. Set before any benchmark imports distributed, and through the
    environment, so spawned workers and ranks read it too."""
    import logging
    import os

    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
    for name in ("distributed", "werkzeug"):
        logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: under 5 minutes on 2 cores")
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=BENCHMARKS)
    parser.add_argument("--json", metavar="PATH", help="write the figures as one JSON object")
    args = parser.parse_args(argv)
    _quiet_logs()

    figures: dict = {}
    not_measured: dict[str, str] = {}
    for name in args.only or BENCHMARKS:
        began = time.monotonic()
        try:
            module = importlib.import_module(f"benchmarks.{MODULES.get(name, name)}")
        except ModuleNotFoundError as exc:
            not_measured[name] = f"module not available: {exc}"
            continue
        try:
            kwargs = {}
            if "lengths" in inspect.signature(module.run).parameters:
                # Real token lengths of the example corpus (benchmarks/workload.py), not synthetic.
                from benchmarks.workload import corpus_profile

                kwargs["lengths"] = corpus_profile().lengths()
            if "figures_so_far" in inspect.signature(module.run).parameters:
                kwargs["figures_so_far"] = dict(figures)  # e.g. the control plane's, for e2e
            figures.update(module.run(quick=args.quick, **kwargs))
        except Exception as exc:  # one failing benchmark must not hide the others' figures
            traceback.print_exc()
            not_measured[name] = f"{type(exc).__name__}: {exc}"
        print(f"[{name}] {time.monotonic() - began:.1f}s", file=sys.stderr)

    print(render_table(figures))
    if not_measured:
        print("\nNot measured:")
        for name, why in not_measured.items():
            print(f"- {name}: {why}")
    if args.json:
        payload = flatten(figures)
        payload["_not_measured"] = not_measured
        payload["_quick"] = bool(args.quick)
        Path(args.json).write_text(json.dumps(payload, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
