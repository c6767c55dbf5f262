"""Sources panel: loaded samples/s and load backlog per source, pool size against its target.

A source whose backlog keeps growing while its samples/s stays flat is starving the trainers; the
table beside the bars shows how many workers serve its pool, the Planner's target for the pool and
the sentence the Planner gave for that target. A source whose loads wait on unreachable storage
gets a line above the bars, and the same sentence in its row ("waiting on storage since 14:03:07
(12 attempts, last error ...)"), so an outage is told apart from a slow pool at a glance.
"""

from __future__ import annotations

import html

from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, DataTable, Div, FactorRange, NumberFormatter, TableColumn
from bokeh.plotting import figure

from scheduler_plugins.dashboard.common import JobSelect, colour, job_message, show
from scheduler_plugins.dashboard.figures import sources_figures

COLUMNS = ("source", "samples_per_s", "loaded_samples", "backlog_chunks", "backlog_rows",
           "failed_chunks", "pool_workers", "target", "reason", "storage", "color")


class SourcesPanel:
    """Per-source throughput, backlog and pool sizing of one job."""

    def __init__(self, scheduler, job: str | None = None, **kwargs) -> None:
        self.scheduler = scheduler
        self.jobs = JobSelect(scheduler, job)
        self.source = ColumnDataSource({c: [] for c in COLUMNS}, name="mdata-sources")
        self.rate = figure(title="loaded samples/s per source (recent window)", x_range=FactorRange(),
                           height=260, sizing_mode="stretch_width", tools="", toolbar_location=None)
        self.rate.vbar(x="source", top="samples_per_s", width=0.8, color="color", source=self.source)
        self.backlog = figure(title="backlog: load tasks outstanding", x_range=self.rate.x_range,
                              height=260, sizing_mode="stretch_width", tools="", toolbar_location=None)
        self.backlog.vbar(x="source", top="backlog_chunks", width=0.8, color="color", source=self.source)
        for fig in (self.rate, self.backlog):
            fig.y_range.start = 0
        fmt = NumberFormatter(format="0,0.0")
        self.table = DataTable(
            source=self.source, index_position=None, height=200, sizing_mode="stretch_width",
            columns=[
                TableColumn(field="source", title="source", width=80),
                TableColumn(field="samples_per_s", title="samples/s", formatter=fmt, width=80),
                TableColumn(field="loaded_samples", title="loaded", width=70),
                TableColumn(field="backlog_chunks", title="backlog (tasks)", width=90),
                TableColumn(field="backlog_rows", title="backlog (rows)", width=90),
                TableColumn(field="failed_chunks", title="failed", width=50),
                TableColumn(field="pool_workers", title="pool workers", width=80),
                TableColumn(field="target", title="target", width=50),
                TableColumn(field="reason", title="reason", width=500),
                TableColumn(field="storage", title="storage", width=500),
            ],
        )
        self.message = Div()
        self.storage = Div(styles={"color": "#b00020"})  # one line per source waiting on storage
        self.root = column(row(self.jobs.widget, self.message), self.storage,
                           row(self.rate, self.backlog, sizing_mode="stretch_width"), self.table,
                           **kwargs)

    def update(self) -> None:
        runtime = self.jobs.current()
        self.message.text = job_message(self.scheduler, runtime)
        if runtime is None:
            self.source.data = {c: [] for c in COLUMNS}
            self.storage.text = ""
            return
        figs = sources_figures(runtime)
        self.storage.text = storage_lines(figs)
        names = figs["source"]
        data = {c: list(figs[c]) for c in COLUMNS if c in figs}
        data["target"] = ["" if t is None else str(t) for t in figs["target_workers"]]
        data["color"] = [colour(i) for i in range(len(names))]
        if list(self.rate.x_range.factors) != names:
            self.rate.x_range.factors = names
        self.source.data = data


def storage_lines(figs: dict) -> str:
    """HTML: ``source: waiting on storage since ...`` for each waiting source; empty when none."""
    return "<br>".join(f"<b>{html.escape(name)}</b>: {html.escape(line)}"
                       for name, line in zip(figs["source"], figs["storage"]) if line)


def sources_doc(scheduler, extra, doc) -> None:
    show(doc, SourcesPanel(scheduler, sizing_mode="stretch_both"), "sources")
