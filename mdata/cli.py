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
    from mdata.errors import MdataError

    try:
        return cluster_up_cli(args)
    except MdataError as exc:
        return _fail(exc)


def _cmd_cluster_status(args: argparse.Namespace) -> int:
    from distributed import Client

    from mdata.driver.cluster_status import cluster_status
    from mdata.driver.tls import TlsFiles, cluster_security
    from mdata.errors import MdataError
    from mdata.trainer.reach import check_listening

    given = (args.tls_ca_file, args.tls_cert, args.tls_key)
    if any(given) and not all(given):
        return _fail("TLS needs --tls-ca-file, --tls-cert and --tls-key together")
    security = None if not all(given) else cluster_security(
        TlsFiles(ca_file=args.tls_ca_file, cert=args.tls_cert, key=args.tls_key), role="trainer")
    try:
        check_listening(args.address)  # nothing there: one line in seconds
        with Client(args.address, timeout=args.timeout, set_as_default=False, security=security) as client:
            print(cluster_status(client))
    except (MdataError, OSError) as exc:
        return _fail(exc)
    return 0


def _print_layout(plan, profile, args: argparse.Namespace) -> None:
    """The layout of ``plan`` from ``profile``: table, dask worker lines, optionally Kubernetes."""
    import os

    from mdata.pools.layout import layout_for_plan
    from mdata.pools.layout_text import dask_worker_commands, kubernetes_manifest

    cores = None if args.rate is not None else (args.cores or os.cpu_count() or 1)
    layout = layout_for_plan(plan, profile, rate=args.rate, cores=cores, basis=args.basis)
    tls = _layout_tls(args)
    print(layout)
    print("\n# start it with the dask CLI:")
    print("\n".join(dask_worker_commands(layout, args.scheduler, tls=tls)))
    if args.kubernetes:
        print("\n# or on Kubernetes (dask-kubernetes operator):")
        print(kubernetes_manifest(layout, tls=tls is not None), end="")


def _layout_tls(args: argparse.Namespace) -> "tuple[str, str, str] | None":
    """The TLS files the printed lines name: the three options as given (paths on the hosts), or
    with ``--tls`` alone the manifest's mount paths; None for plain TCP."""
    from mdata.errors import PlanError
    from mdata.pools.layout_text import TLS_MOUNT

    given = (args.tls_ca_file, args.tls_cert, args.tls_key)
    if not args.tls and not any(given):
        return None
    if any(given) and not all(given):
        raise PlanError("TLS needs --tls-ca-file, --tls-cert and --tls-key together (or --tls alone)")
    return given if all(given) else (f"{TLS_MOUNT}/ca.pem", f"{TLS_MOUNT}/cert.pem", f"{TLS_MOUNT}/key.pem")


def _cmd_profile(args: argparse.Namespace) -> int:
    from pathlib import Path

    from mdata.errors import MdataError
    from mdata.plan import Plan
    from mdata.pools.profile import default_profile_path
    from mdata.pools.profiling import profile_sources

    try:
        plan = Plan.from_file(args.plan)
        profile = profile_sources(plan.sources, rows=args.rows, threads=args.threads)
        out = Path(args.out) if args.out else default_profile_path(args.plan)
        profile.save(out)
        print(profile.table())
        print(f"wrote {out}")
        if args.layout:
            print()
            _print_layout(plan, profile, args)
    except MdataError as exc:
        return _fail(exc)
    return 0


def _cmd_plan_layout(args: argparse.Namespace) -> int:
    from mdata.errors import MdataError
    from mdata.plan import Plan
    from mdata.pools.profile import Profile

    try:  # sources stay specs: the layout needs their names and the profile, not their code
        _print_layout(Plan.from_file(args.plan, build_sources=False), Profile.load(args.profile), args)
    except MdataError as exc:
        return _fail(exc)
    return 0


def _layout_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--rate", type=float, default=None,
                       help="target steps/s the pools must feed (default: the fastest --cores allow)")
    group.add_argument("--cores", type=int, default=None,
                       help="loader cores to lay out (default: this machine's CPUs; for `cluster up`, "
                       "less the constructors' threads)")
    parser.add_argument("--basis", choices=["cpu", "wall"], default="cpu",
                        help="per-sample cost from the profile: CPU time (default; a busy profiling "
                        "machine does not move it) or wall time (counts storage waits: remote data)")


def _tls_args(parser: argparse.ArgumentParser, *, up: bool) -> None:
    """TLS options, under the dask CLI's own names; ``up``: those of a cluster this command runs."""
    parser.add_argument("--tls-ca-file", default=None, help="CA certificate (PEM) every peer must be signed by")
    parser.add_argument("--tls-cert", default=None, help="certificate (PEM) the cluster's processes present")
    parser.add_argument("--tls-key", default=None, help="its private key (PEM)")
    if up:
        parser.add_argument("--tls-auto", action="store_true",
                            help="make a throwaway CA and certificates (in --tls-dir), run on tls:// and "
                            "print how trainers attach")
        parser.add_argument("--tls-dir", default=None, help="folder --tls-auto writes (default ./.mdata-tls)")
    else:
        parser.add_argument("--tls", action="store_true",
                            help="the cluster uses TLS: lines carry the TLS options (paths: the three "
                            "options above, default the manifest's /etc/mdata/tls/{ca,cert,key}.pem)")


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
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    data = sub.add_parser("data", help="build and inspect data sets").add_subparsers(
        dest="data_command", required=True
    )
    example = data.add_parser("example", help="build the real multi-source example corpus")
    example.add_argument("dest", help="folder to write the corpus into")
    example.add_argument("--size", choices=["small", "full"], default="small",
                         help="small (default, about a minute) or full (every play, poem and module)")
    example.add_argument(
        "--material",
        default=None,
        help="folder with the downloaded material (default: .cache/mdata/material, filled by setup)",
    )
    example.set_defaults(func=_cmd_data_example)

    demo = sub.add_parser("demo", help="run the demo job on an embedded LocalCluster")
    demo.add_argument("--steps", type=int, default=20, help="training steps to run (default 20)")
    demo.add_argument("--json", default=None, help="write the summary as JSON to this path")
    demo.add_argument("--data", default="example-data", help="example corpus folder (built if missing)")
    demo.add_argument("--quiet", action="store_true", help="print the summary only, no per-step lines")
    demo.set_defaults(func=_cmd_demo)

    cluster = sub.add_parser("cluster", help="start or inspect an mdata cluster").add_subparsers(
        dest="cluster_command", required=True
    )
    up = cluster.add_parser("up", help="start an embedded cluster and print its addresses")
    up.add_argument("--data", default="example-data",
                    help="example corpus folder served without --plan (built if missing)")
    up.add_argument("--host", default="127.0.0.1",
                    help="address to bind (default loopback; another host's trainers need this host's address)")
    up.add_argument("--constructors", type=int, default=None,
                    help="constructor workers (default: mdata.cluster.constructors, 1)")
    up.add_argument("--port", type=int, default=8786, help="scheduler port (0: any free port)")
    up.add_argument("--dashboard-address", default=":8787", help="dashboard address; without a host it binds to --host "
                    "(':0': any port; '0.0.0.0:8787': every interface)")
    up.add_argument("--plan", default=None,
                    help="a plan file (docs/plan-files.md): serve its sources and register it as --job "
                    "(default: the example corpus in --data, no job)")
    up.add_argument("--job", default="default", help="job name the --plan is registered as")
    up.add_argument("--profile", default=None,
                    help="a profile of the plan's sources (`mdata profile`): lay the pools out from "
                    "it (default: expensive sources get a pool each, cheap ones share)")
    up.add_argument("-v", "--verbose", action="count", default=0,
                    help="show Dask's INFO log (-vv: DEBUG); by default only its warnings and errors")
    up.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=None,
                    help="level of Dask's and mdata's log (default warning; overrides -v and "
                    "DASK_LOGGING__DISTRIBUTED)")
    up.add_argument("--status-every", type=float, default=None, metavar="SECONDS",
                    help="seconds between each job's live line (step, steps/s, stall, sources "
                    "waiting): default 1 on a terminal, rewritten in place, else 10, printed when "
                    "it changed; 0: none")
    _layout_args(up)
    _tls_args(up, up=True)
    up.set_defaults(func=_cmd_cluster_up)
    status = cluster.add_parser("status", help="print a running cluster's workers and jobs: how far "
                                "each job got, trainers' waits, pool targets, sources waiting on storage")
    status.add_argument("address", help="the scheduler's address (tcp://HOST:8786, as `cluster up` prints)")
    status.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the scheduler (default 10)")
    status.add_argument("--tls-ca-file", default=None, help="CA certificate (PEM) of a TLS cluster")
    status.add_argument("--tls-cert", default=None, help="certificate (PEM) to present")
    status.add_argument("--tls-key", default=None, help="its private key (PEM)")
    status.set_defaults(func=_cmd_cluster_status)

    prof = sub.add_parser("profile", help="measure what each source of a plan costs a loader per "
                          "sample, write a profile file and print a table")
    prof.add_argument("plan", help="a plan file (YAML or JSON; docs/plan-files.md)")
    prof.add_argument("--rows", type=int, default=64, help="rows read per source (default 64)")
    prof.add_argument("--threads", type=int, default=None,
                      help="threads of the scaling measurement (default: min(4, CPUs); 1 skips it)")
    prof.add_argument("--out", default=None,
                      help="profile file to write (default: PLAN_STEM.profile.json beside the plan file)")
    prof.add_argument("--layout", action="store_true", help="also print the pool layout it implies")
    prof.add_argument("--scheduler", default="tcp://SCHEDULER:8786", help="address in the dask worker lines")
    prof.add_argument("--kubernetes", action="store_true", help="also print a dask-kubernetes manifest")
    _layout_args(prof)
    _tls_args(prof, up=False)
    prof.set_defaults(func=_cmd_profile)

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
    lay = plan.add_parser("layout", help="loader pools for a plan from its profile: a table, dask "
                          "worker lines and (--kubernetes) a worker-group manifest")
    lay.add_argument("plan", help="a plan file (YAML or JSON; docs/plan-files.md)")
    lay.add_argument("--profile", required=True, help="the plan's profile (`mdata profile PLAN`)")
    lay.add_argument("--scheduler", default="tcp://SCHEDULER:8786", help="address in the dask worker lines")
    lay.add_argument("--kubernetes", action="store_true", help="also print a dask-kubernetes manifest")
    _layout_args(lay)
    _tls_args(lay, up=False)
    lay.set_defaults(func=_cmd_plan_layout)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from mdata.distribution import DISTRIBUTION

    try:
        return version(DISTRIBUTION)  # not "mdata": that name on the index is another project
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `mdata plan show plan.yaml | head`: the reader left, which is fine
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)  # no second error when Python flushes stdout
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
