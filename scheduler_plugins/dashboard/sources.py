"""Sources panel: loads, backlog, pool workers and demand per source over time, and the table.

Four plots share one time axis (seconds since the job started): loaded samples/s per source,
load tasks outstanding (a backlog that keeps growing means the pool is too small), the workers
serving each source's pool against the Planner's target (solid: serving, dashed: target; a dot
for every decision that changed a target, its reason on hover), and the demand in busy threads
the target came from. The table under them shows each source's figures now, its pool's size and
target and the sentence the Planner gave for it. A source whose loads wait on unreachable storage
gets a line above the plots, and the same sentence in its row ("waiting on storage since
14:03:07 (12 attempts, last error ...)"), so an outage is told apart from a slow pool at a glance.
The autoscaler's state (running, errors it survived) is in the line above the plots too.

The plots are time series, not bars of the last few seconds: loads come in bursts (a window of
chunks at a time), so a "recent window" bar chart was empty most of the time during a long run,
drawn on Bokeh's default 0-1 axis while the table still showed the burst (Bokeh's DataTable does
not redraw when a source's columns change but its length does not; the panel makes the table redraw
whenever its data changes, see :meth:`SourcesPanel.update`).
"""

from __future__ import annotations

import html

from bokeh.layouts import column, gridplot, row
from bokeh.models import (ColumnDataSource, DataTable, Div, HoverTool, HTMLTemplateFormatter,
                          NumberFormatter, TableColumn)
from bokeh.plotting import figure

from scheduler_plugins.dashboard.common import JobSelect, colour, hide_on_click, job_message, show
from scheduler_plugins.dashboard.figures import pools_timeline, sources_figures

COLUMNS = ("source", "samples_per_s", "loaded_samples", "backlog_chunks", "backlog_rows",
           "failed_chunks", "pool_workers", "target", "reason", "storage", "quarantined", "color")
LINES = ("xs", "ys", "source_name", "color")
DECISIONS = ("time", "target", "source_name", "kind", "by", "reason", "color")
#: Long text cells wrap inside their (tall) rows, the whole text on hover, instead of being cut.
WRAP = ('<div title="<%- value %>" style="white-space: normal; line-height: 1.25; overflow-y: auto; '
        'height: 100%"><%- value %></div>')
#: (field, title, width in px): every width holds its title, so no header is cut.
TABLE = (("source", "source", 90), ("samples_per_s", "samples/s", 90), ("loaded_samples", "loaded", 80),
         ("backlog_chunks", "backlog (tasks)", 135), ("backlog_rows", "backlog (rows)", 125),
         ("failed_chunks", "failed", 60), ("pool_workers", "pool workers", 110),
         ("target", "target", 60), ("reason", "reason for the target", 520),
         ("storage", "storage", 360), ("quarantined", "quarantined (on_corrupt='skip')", 260))


class SourcesPanel:
    """Per-source throughput, backlog and pool sizing of one job, over time."""

    def __init__(self, scheduler, job: str | None = None, **kwargs) -> None:
        self.scheduler = scheduler
        self.jobs = JobSelect(scheduler, job)
        self.source = ColumnDataSource({c: [] for c in COLUMNS}, name="mdata-sources")
        self.lines = {key: ColumnDataSource({c: [] for c in LINES}, name=f"mdata-sources-{key}")
                      for key in ("rate", "backlog", "workers", "target", "demand")}
        self.decisions = ColumnDataSource({c: [] for c in DECISIONS}, name="mdata-sources-decisions")
        opts = dict(height=230, sizing_mode="stretch_width", tools="", toolbar_location=None)
        self.rate = figure(title="loaded samples/s per source", **opts)
        self.backlog = figure(title="backlog: load tasks outstanding", x_range=self.rate.x_range, **opts)
        self.workers = figure(title="pool workers (solid) and Planner target (dashed); dots: decisions",
                              x_range=self.rate.x_range, **opts)
        self.demand = figure(title="demand: busy loader threads (headroom included)",
                             x_range=self.rate.x_range, **opts)
        for fig, key, unit in ((self.rate, "rate", "samples/s"), (self.backlog, "backlog", "load tasks"),
                               (self.workers, "workers", "workers"),
                               (self.demand, "demand", "busy loader threads")):
            fig.yaxis.axis_label = unit
            fig.multi_line(xs="xs", ys="ys", line_color="color", line_width=2, source=self.lines[key],
                           line_alpha=0.8, legend_field="source_name")
            fig.y_range.start = 0
            fig.xaxis.axis_label = "seconds since the job started"
            fig.legend.location = "top_left"
        hide_on_click(self.rate, self.backlog, self.workers, self.demand)
        self.workers.multi_line(xs="xs", ys="ys", line_color="color", line_width=2, line_alpha=0.6,
                                line_dash="dashed", source=self.lines["target"])
        dots = self.workers.scatter(x="time", y="target", color="color", size=9, source=self.decisions)
        self.workers.add_tools(HoverTool(renderers=[dots], tooltips=[
            ("source", "@source_name"), ("decision", "@kind by @by"), ("reason", "@reason")]))
        # a formatter per panel: a Bokeh model belongs to one document (one browser tab)
        formats = {"samples_per_s": NumberFormatter(format="0,0.0"),
                   **{f: HTMLTemplateFormatter(template=WRAP) for f in ("reason", "storage", "quarantined")}}
        # widths as given (autosize "none": the table scrolls sideways rather than squeeze its
        # columns and cut their titles); rows tall enough for a reason of three lines
        self.table = DataTable(
            source=self.source, index_position=None, height=260, sizing_mode="stretch_width",
            autosize_mode="none", row_height=60, name="mdata-sources-table",
            columns=[TableColumn(field=f, title=t, width=w, **({"formatter": formats[f]} if f in formats else {}))
                     for f, t, w in TABLE],
        )
        self.message = Div()
        self.storage = Div(styles={"color": "#b00020"})  # storage waits, autoscaler errors
        grid = gridplot([[self.rate, self.backlog], [self.workers, self.demand]],
                        sizing_mode="stretch_width", toolbar_location=None)
        self.root = column(row(self.jobs.widget, self.message), self.storage, grid, self.table,
                           **kwargs)

    def update(self) -> None:
        runtime = self.jobs.current()
        self.message.text = job_message(self.scheduler, runtime)
        if runtime is None:
            self.source.data = {c: [] for c in COLUMNS}
            for src in self.lines.values():
                src.data = {c: [] for c in LINES}
            self.decisions.data = {c: [] for c in DECISIONS}
            self.storage.text = ""
            return
        figs = sources_figures(runtime)
        timeline = pools_timeline(runtime)
        self.storage.text = "<br>".join(filter(None, (storage_lines(figs),
                                                      scaler_line(timeline["autoscaler"]))))
        names = figs["source"]
        data = {c: list(figs[c]) for c in COLUMNS if c in figs}
        data["target"] = ["" if t is None else str(t) for t in figs["target_workers"]]
        data["color"] = [colour(i) for i in range(len(names))]
        if data != dict(self.source.data):
            self.source.data = data
            # a DataTable redraws when the table changes, not when its source's columns change at
            # the same length: flip an invisible property (the index column is hidden)
            self.table.index_header = "#" if self.table.index_header != "#" else "# "
        self._update_lines(timeline)

    def _update_lines(self, timeline: dict) -> None:
        names = timeline["sources"]
        colours = [colour(i) for i in range(len(names))]
        series = {
            "rate": [(timeline["time"], timeline["samples_per_s"][n]) for n in names],
            "backlog": [(timeline["time"], timeline["backlog"][n]) for n in names],
            "workers": [(timeline["pools"][n]["time"], timeline["pools"][n]["workers"]) for n in names],
            "target": [(timeline["pools"][n]["time"], timeline["pools"][n]["target"]) for n in names],
            "demand": [(timeline["pools"][n]["time"], timeline["pools"][n]["demand"]) for n in names],
        }
        for key, pairs in series.items():
            self.lines[key].data = {"xs": [list(x) for x, _ in pairs], "ys": [list(y) for _, y in pairs],
                                    "source_name": list(names), "color": colours}
        dec = timeline["decisions"]
        index = {n: i for i, n in enumerate(names)}
        self.decisions.data = {"time": dec["time"], "target": dec["target"],
                               "source_name": dec["source"], "kind": dec["kind"], "by": dec["by"],
                               "reason": dec["reason"],
                               "color": [colours[index[s]] for s in dec["source"]]}


def storage_lines(figs: dict) -> str:
    """HTML: ``source: waiting on storage since ...`` for each waiting source; empty when none."""
    return "<br>".join(f"<b>{html.escape(name)}</b>: {html.escape(line)}"
                       for name, line in zip(figs["source"], figs["storage"]) if line)


def scaler_line(status: dict | None) -> str:
    """HTML: the autoscaler's errors, when it survived any; empty otherwise."""
    if not status or not status["errors"]:
        return ""
    return (f"<b>autoscaler</b>: {status['errors']} error(s) survived, last: "
            f"{html.escape(status['last_error'])}")


def sources_doc(scheduler, extra, doc) -> None:
    show(doc, SourcesPanel(scheduler, sizing_mode="stretch_both"), "sources")
