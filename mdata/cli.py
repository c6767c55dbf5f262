"""The ``mdata`` command line.

Each subcommand imports its implementation lazily so that ``mdata --help`` stays fast and a
missing optional part only breaks the subcommand that needs it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _cmd_data_example(args: argparse.Namespace) -> int:
    from mdata.data.example import build_example_corpus

    report = build_example_corpus(args.dest, size=args.size, material=args.material)
    print(report.to_text())
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from mdata.driver.demo import run_demo

    return run_demo(steps=args.steps, json_path=args.json, data_dir=args.data, quiet=args.quiet)


def _cmd_cluster_up(args: argparse.Namespace) -> int:
    from mdata.driver import cluster_up_cli

    return cluster_up_cli(args)


def _fail(exc: Exception) -> int:
    print(f"mdata: error: {exc}", file=sys.stderr)
    return 2


def _cmd_plan_show(args: argparse.Namespace) -> int:
    from mdata.errors import MdataError
    from mdata.plan import Plan
    from mdata.plan_report import plan_table

    try:  # sources stay specs: showing a plan imports none of its transforms
        print(plan_table(Plan.from_file(args.plan, build_sources=False)))
    except MdataError as exc:
        return _fail(exc)
    return 0


def _cmd_plan_simulate(args: argparse.Namespace) -> int:
    from mdata.errors import MdataError, PlanError
    from mdata.metadata import read_metadata
    from mdata.plan import Plan
    from mdata.plan_report import simulation_report
    from mdata.planner import simulate

    try:
        plan = Plan.from_file(args.plan)
        names_only = [s for s in plan.sources if isinstance(s, str)]
        if names_only:
            raise PlanError(f"sources {names_only} are names only: simulate reads each source's "
                            "real samples, so every source needs its url and transform")
        metadata = read_metadata(plan.sources, max_rows_per_shard=args.max_rows_per_shard)
        result = simulate(plan, args.steps, metadata)
        print(simulation_report(result, step_rows=args.step_rows))
        if args.plots:
            from mdata.plan_plots import write_plots

            for path in write_plots(result, args.plots):
                print(f"wrote {path}")
    except MdataError as exc:
        return _fail(exc)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mdata", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    data = sub.add_parser("data", help="build and inspect data sets").add_subparsers(
        dest="data_command", required=True
    )
    example = data.add_parser("example", help="build the real multi-source example corpus")
    example.add_argument("dest", help="folder to write the corpus into")
    example.add_argument("--size", choices=["small", "full"], default="small")
    example.add_argument(
        "--material",
        default=None,
        help="folder with the downloaded material (default: .cache/mdata/material, filled by setup)",
    )
    example.set_defaults(func=_cmd_data_example)

    demo = sub.add_parser("demo", help="run the demo job on an embedded LocalCluster")
    demo.add_argument("--steps", type=int, default=20)
    demo.add_argument("--json", default=None, help="write the summary as JSON to this path")
    demo.add_argument("--data", default="example-data", help="example corpus folder (built if missing)")
    demo.add_argument("--quiet", action="store_true")
    demo.set_defaults(func=_cmd_demo)

    cluster = sub.add_parser("cluster", help="start or inspect an mdata cluster").add_subparsers(
        dest="cluster_command", required=True
    )
    up = cluster.add_parser("up", help="start an embedded cluster and print its addresses")
    up.add_argument("--data", default="example-data")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--constructors", type=int, default=None)
    up.add_argument("--port", type=int, default=8786, help="scheduler port (0: any free port)")
    up.add_argument("--dashboard-address", default=":8787", help="dashboard address (':0': any port)")
    up.add_argument("--plan", default=None,
                    help="a plan file (docs/plan-files.md): serve its sources and register it as --job "
                    "(default: the example corpus in --data, no job)")
    up.add_argument("--job", default="default", help="job name the --plan is registered as")
    up.set_defaults(func=_cmd_cluster_up)

    plan = sub.add_parser("plan", help="show or simulate a plan file").add_subparsers(
        dest="plan_command", required=True
    )
    show = plan.add_parser("show", help="print a plan file's sources and settings as a table")
    show.add_argument("plan", help="a plan file (YAML or JSON; docs/plan-files.md)")
    show.set_defaults(func=_cmd_plan_show)
    sim = plan.add_parser("simulate", help="plan N steps on the sources' real samples, offline, and "
                          "print the mixture and balance figures")
    sim.add_argument("plan", help="a plan file (YAML or JSON; docs/plan-files.md)")
    sim.add_argument("--steps", type=int, required=True, help="steps to simulate")
    sim.add_argument("--plots", default=None, help="folder to write mixture.png and balance.png into "
                     "(needs matplotlib)")
    sim.add_argument("--max-rows-per-shard", type=int, default=None,
                     help="profile only the first rows of each shard (quicker, approximate)")
    sim.add_argument("--step-rows", type=int, default=10, help="steps listed one by one (default 10)")
    sim.set_defaults(func=_cmd_plan_simulate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
