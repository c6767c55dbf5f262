"""JSON routes for the figures of mdata's dashboard pages, served by the scheduler's HTTP server.

    /mdata/api/jobs                                  every job: identity and progress
    /mdata/api/<job>/sources | pools | mixture | balance | trainers | waiting
                                                     (mixture, balance: ?last=N steps)
    /mdata/api/<job>/story/<source>/<shard>/<row>    the lineage story of one sample (whole run)

The figures come from :mod:`scheduler_plugins.dashboard.figures`, as the pages' do. distributed
reads the modules whose ``routes`` it serves from the ``distributed.scheduler.http.routes`` config
when a scheduler starts, after importing preload modules; :func:`register_routes`, called when
``scheduler_plugins.planner`` is imported, adds this module there. Errors answer with a status
code and a JSON body whose ``error`` says what was wrong and what exists.
"""

from __future__ import annotations

import json

import dask
from distributed.http.utils import RequestHandler

from mdata.errors import MdataError
from scheduler_plugins import stories
from scheduler_plugins.dashboard import figures
from scheduler_plugins.dashboard.common import NO_PLANNER, planner

MODULE = "scheduler_plugins.dashboard.routes"
CONFIG_KEY = "distributed.scheduler.http.routes"

FIGURES = {
    "sources": figures.sources_figures,
    "pools": figures.pools_timeline,
    "mixture": figures.mixture_figures,
    "balance": figures.balance_figures,
    "trainers": figures.trainers_figures,
    "waiting": figures.waiting_figures,
}


class _JSONHandler(RequestHandler):
    def write_json(self, payload, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(payload, allow_nan=False, default=str))

    def fail(self, status: int, message: str) -> None:
        self.write_json({"error": message}, status)

    def _plugin(self):
        plugin = planner(self.server)
        if plugin is None:
            self.fail(503, NO_PLANNER)
        return plugin

    def _runtime(self, job: str):
        plugin = self._plugin()
        if plugin is None:
            return None
        runtime = plugin.jobs.get(job)
        if runtime is None:
            self.fail(404, f"no mdata job named {job!r}; jobs: {sorted(plugin.jobs)}")
        return runtime


class JobsHandler(_JSONHandler):
    """``/mdata/api/jobs``: jobs in registration order, the most recent last."""

    def get(self) -> None:
        plugin = self._plugin()
        if plugin is not None:
            jobs = [figures.job_summary(r) for r in plugin.jobs.values()]
            self.write_json({"jobs": jobs, "latest": jobs[-1]["job"] if jobs else None})


class FiguresHandler(_JSONHandler):
    """``/mdata/api/<job>/<panel>``: the figures one dashboard panel draws."""

    def get(self, job: str, panel: str) -> None:
        build = FIGURES.get(panel)
        if build is None:
            self.fail(404, f"no mdata figures named {panel!r}; choose one of {sorted(FIGURES)}")
            return
        kwargs = {}
        last = self.get_query_argument("last", None)
        if last is not None:
            if panel not in ("mixture", "balance") or not last.isdigit():
                self.fail(400, f"?last= takes a number of steps and applies to mixture and balance, "
                               f"not {panel!r} with {last!r}")
                return
            kwargs["last"] = int(last)
        runtime = self._runtime(job)
        if runtime is not None:
            self.write_json(build(runtime, **kwargs))


class StoryHandler(_JSONHandler):
    """``/mdata/api/<job>/story/<source>/<shard>/<row>``: one sample's story, event by event."""

    async def get(self, job: str, source: str, shard: str, row: str) -> None:
        runtime = self._runtime(job)
        if runtime is None:
            return
        sample_id = f"{source}/{shard}/{row}"
        try:  # the DGraph's part under the job's lock, spilled lineage in a thread
            sid = figures.story_sample(runtime, sample_id)
            occurrences = await stories.story(runtime, sid)
            if not occurrences:  # say why, rather than answer no rows
                raise stories.never_planned(runtime, sid)
        except MdataError as exc:
            self.fail(404, str(exc))
            return
        rows = figures.story_table(occurrences)
        note = runtime.lineage.note() if runtime.lineage is not None else ""
        self.write_json({"job": job, "sample_id": sample_id, "columns": list(figures.STORY_COLUMNS),
                         "rows": rows, "lineage_unavailable": note})


_NAME = r"([^/]+)"

routes: list[tuple] = [
    (r"mdata/api/jobs/?", JobsHandler, {}),
    (rf"mdata/api/{_NAME}/story/{_NAME}/(-?[0-9]+)/(-?[0-9]+)/?", StoryHandler, {}),
    (rf"mdata/api/{_NAME}/([a-z]+)/?", FiguresHandler, {}),
]


def register_routes() -> bool:
    """Make every scheduler started from now on in this process serve these routes (idempotent).

    Returns whether the config changed. Schedulers already running keep their routes.
    """
    modules = list(dask.config.get(CONFIG_KEY, default=[]) or [])
    if MODULE in modules:
        return False
    dask.config.set({CONFIG_KEY: modules + [MODULE]})
    return True
