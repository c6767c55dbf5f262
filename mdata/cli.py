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
    up.set_defaults(func=_cmd_cluster_up)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
