"""``mdata cluster up``: an embedded cluster in a terminal, saying the things a user needs.

What it prints, in order: the scheduler's address and the dashboard links, one line per mdata
page (what trainers and a browser need), the pools, the job a ``--plan`` registers, then one live line per job while it
runs (step, steps/s, the trainers' exposed stall, sources waiting on storage:
:mod:`mdata.driver.progress`, the figures ``mdata cluster status`` prints). Dask's own log is
kept at WARNING unless ``-v``/``--log-level`` asks for more (:mod:`mdata.driver.dask_logs`), and
a plan whose source path matches nothing is one line naming the source, the path and the plan
file, not scheduler tracebacks (the registration's typed error, raised once, here).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from mdata.observe.dashboard_pages import PAGES, page_lines
from mdata.driver.cluster import start_cluster
from mdata.errors import MdataError, PlanError
from mdata.gc_freeze import dedicate_process

__all__ = ["cluster_up_cli", "dashboard_lines"]

#: mdata's dashboard pages by title (the table: :data:`mdata.observe.dashboard_pages.PAGES`)
MDATA_PAGES = tuple(page.title for page in PAGES)


def _plan_to_serve(path: str):
    """The plan of ``mdata cluster up --plan``, read as the scheduler reads it (this process runs
    the scheduler): sources stay specs, only built-in or trusted cost models and mixtures. Its
    warnings (a source left out of the mixture) are printed as one line each."""
    from mdata.plan import Plan
    from mdata.spec import scheduler_trust

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = Plan.from_file(path, build_sources=False, trust=scheduler_trust())
    for warning in caught:
        print(f"mdata: warning: {warning.message}", file=sys.stderr)
    names_only = [s for s in plan.sources if isinstance(s, str)]
    if names_only:
        raise PlanError(f"plan file {path!r}: sources {names_only} are names only; a cluster serves "
                        "sources with a url, format and transform")
    try:
        return plan.validate()
    except PlanError as exc:
        raise PlanError(f"plan file {path!r}: {exc}") from None


def _layout_to_serve(plan, args: argparse.Namespace):
    """The pools of ``--profile`` (a file ``mdata profile`` wrote) at ``--rate`` steps/s, or the
    fastest that fits ``--cores`` loader cores (default: this machine's CPUs less the
    constructors' threads); None without a profile."""
    if not getattr(args, "profile", None):
        return None
    import os

    from mdata import config
    from mdata.pools.layout import layout_for_plan
    from mdata.pools.profile import Profile

    rate = getattr(args, "rate", None)
    cores = None
    if rate is None:
        constructors = args.constructors if args.constructors is not None else config.get("cluster.constructors")
        spare = (os.cpu_count() or 1) - int(constructors) * int(config.get("cluster.constructor-threads"))
        cores = getattr(args, "cores", None) or max(1, spare)
    return layout_for_plan(plan, Profile.load(args.profile), rate=rate, cores=cores,
                           basis=getattr(args, "basis", "cpu"))


def dashboard_lines(scheduler_address: str, dashboard_link: str | None) -> list[str]:
    """The first lines ``cluster up`` prints: where trainers attach, where a browser looks (Dask's
    dashboard, then every mdata page with its full URL and what it answers)."""
    lines = [f"scheduler: {scheduler_address}"]
    if dashboard_link:
        lines += [f"dashboard: {dashboard_link}", *page_lines(dashboard_link)]
    return lines


def _log_level(args: argparse.Namespace) -> tuple[str, bool]:
    """The level Dask logs at, and whether the command line asked for it (then it wins over
    ``DASK_LOGGING__DISTRIBUTED``)."""
    if getattr(args, "log_level", None):
        return args.log_level, True
    verbose = int(getattr(args, "verbose", 0) or 0)
    if verbose:
        return ("info" if verbose == 1 else "debug"), True
    return "warning", False


def cluster_up_cli(args: argparse.Namespace) -> int:
    """``mdata cluster up``: start the embedded cluster and wait. With ``--plan``, serve the plan
    file's sources and register it as ``--job``; otherwise serve the example corpus."""
    from mdata.driver.dask_logs import set_dask_log_level

    plan = layout = None
    if getattr(args, "plan", None):
        plan = _plan_to_serve(args.plan)
        sources = list(plan.sources)
        layout = _layout_to_serve(plan, args)
    elif getattr(args, "profile", None):
        raise PlanError("--profile lays out the pools of a plan's sources: give --plan too")
    else:
        from mdata.data.example import build_example_corpus, example_sources

        if not (Path(args.data) / "manifest.json").exists():
            build_example_corpus(args.data, size="small")
        sources = example_sources(args.data)
    level, asked = _log_level(args)
    set_dask_log_level(level, force=asked)  # before the cluster's processes start
    from mdata.driver.tls import cluster_security, tls_files_from_args, trainer_usage

    tls = tls_files_from_args(args)  # None: plain TCP; else tls:// for every process (mdata.driver.tls)
    security = None if tls is None else cluster_security(tls)
    dedicate_process()  # this process only serves: its scheduler may freeze (mdata.gc_freeze)
    _stop_on_sigterm()
    with start_cluster(sources, layout=layout, constructors=args.constructors, host=args.host,
                       dashboard_address=args.dashboard_address, scheduler_port=args.port,
                       security=security) as c:
        print("\n".join(dashboard_lines(c.scheduler_address, c.dashboard_link)), flush=True)
        if layout is not None:
            print(layout, flush=True)
        print("pools: " + ", ".join(f"{p.name}={list(p.sources)} ({p.workers}x{p.threads})"
                                    for p in c.pools.values()))
        from distributed import Client

        with Client(c.scheduler_address, set_as_default=False, security=security) as client:
            if plan is not None:
                _register(client, plan, args)
            if tls is not None:
                print(trainer_usage(tls, c.scheduler_address))
            print("press Ctrl-C to stop", flush=True)
            try:
                _watch(client, _status_every(args))
            except KeyboardInterrupt:
                pass
    return 0


def _stop_on_sigterm() -> None:
    """SIGTERM (``kill``, systemd, Kubernetes) stops the cluster as Ctrl-C does, closing the
    Planner's jobs, the workers and the scheduler in order, and the command exits 0. Without
    this, SIGTERM ended the process at once: its workers went with it, but nothing closed."""
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def _register(client, plan, args: argparse.Namespace) -> None:
    """Register the plan as ``--job``; an error (a source path that matches no file, a transform
    the loaders do not trust) becomes one line naming the plan file too."""
    from mdata.driver.submit import submit_job

    try:
        info = submit_job(client, plan, job=args.job)
    except MdataError as exc:
        raise PlanError(f"plan file {args.plan!r}: job {args.job!r} not registered: {exc}") from None
    print(f"job: {args.job} (fingerprint {info['fingerprint']}, world size {info['world_size']})")


def _status_every(args: argparse.Namespace) -> float:
    """Seconds between live lines: ``--status-every``, else 1 on a terminal and 10 elsewhere (a
    log file gets a job's line when it changed, at most that often); 0 turns them off."""
    every = getattr(args, "status_every", None)
    if every is not None:
        return max(0.0, float(every))
    return 1.0 if sys.stdout.isatty() else 10.0


def _watch(client, every: float) -> None:
    """Show each registered job's live line every ``every`` seconds until Ctrl-C (forever, quietly,
    when ``every`` is 0)."""
    from mdata.driver.job import JobHandle
    from mdata.driver.progress import JobProgress, StatusBoard, StepRate, live_line

    if every <= 0:
        while True:
            time.sleep(3600)
    board = StatusBoard(sys.stdout, tty=sys.stdout.isatty())
    rates: dict[str, StepRate] = {}
    while True:
        lines: dict[str, str] = {}
        try:
            jobs = JobHandle.jobs(client)
        except (MdataError, OSError):  # the scheduler busy or going away: try again next time
            jobs = []
        for job in jobs:
            try:
                status: dict[str, Any] = JobHandle(client, job).status(max_steps=0)
            except (MdataError, OSError):  # closed between the two questions
                continue
            progress = JobProgress.of(status)
            rate = rates.setdefault(job, StepRate()).add(time.monotonic(), progress.step)
            lines[job] = live_line(progress, rate, time.time())
        if lines:
            board.show(lines)
        time.sleep(every)
