"""Waiting panel: is training waiting on data, on which rank, on which source?

An exposed wait is the time a rank's training loop was blocked in the Loader for a step's batch:
the GPU time data cost (the prefetchers' own waits overlap compute and are on the trainers page).
A sentence above the plots answers the question; then, per rank, the wait of every step (one line
per rank, its legend clickable to hide a rank); the same waits as dots coloured by the source each
is attributed to (hover: rank, step, seconds, source); and the total wait blamed on each source.
The attribution rule is :mod:`mdata.observe.data_waits`'s: a source of the step waiting on storage, else
the source whose chunks for that step were loaded last.
"""

from __future__ import annotations

import html

from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, Div, FactorRange, HoverTool
from bokeh.plotting import figure

from scheduler_plugins.dashboard.common import JobSelect, colour, hide_on_click, job_message, show
from scheduler_plugins.dashboard.figures import waiting_figures

LINES = ("xs", "ys", "rank", "color")
DOTS = ("step", "wait_s", "rank", "source_name", "time_s", "color")
TOTALS = ("source_name", "wait_s", "color")
NONE = "(too short to blame)"


class WaitingPanel:
    """Per-rank exposed waits of one job and the sources they are blamed on."""

    def __init__(self, scheduler, job: str | None = None, **kwargs) -> None:
        self.scheduler = scheduler
        self.jobs = JobSelect(scheduler, job)
        self.lines = ColumnDataSource({c: [] for c in LINES}, name="mdata-waiting-ranks")
        self.dots = ColumnDataSource({c: [] for c in DOTS}, name="mdata-waiting-waits")
        self.totals = ColumnDataSource({c: [] for c in TOTALS}, name="mdata-waiting-sources")
        opts = dict(height=260, sizing_mode="stretch_width", tools="pan,wheel_zoom,reset")
        self.per_rank = figure(title="exposed wait per step (s), one line per rank: click a rank "
                               "in the legend to hide it", x_axis_label="step",
                               y_axis_label="seconds the training loop waited", **opts)
        self.per_rank.multi_line(xs="xs", ys="ys", line_color="color", line_width=2, line_alpha=0.7,
                                 legend_field="rank", source=self.lines)
        self.blamed = figure(title="each wait, coloured by the source it is attributed to",
                             x_range=self.per_rank.x_range, x_axis_label="step",
                             y_axis_label="seconds the training loop waited", **opts)
        dots = self.blamed.scatter(x="step", y="wait_s", color="color", size=8, alpha=0.7,
                                   legend_field="source_name", source=self.dots)
        self.blamed.add_tools(HoverTool(renderers=[dots], tooltips=[
            ("rank", "@rank"), ("step", "@step"), ("wait", "@wait_s{0.000} s"),
            ("source", "@source_name"), ("told at", "@time_s{0.0} s since the job started")]))
        self.by_source = figure(title="exposed wait blamed on each source (s, all ranks)",
                                y_range=FactorRange(), height=200, sizing_mode="stretch_width",
                                tools="", toolbar_location=None, x_axis_label="seconds")
        self.by_source.hbar(y="source_name", right="wait_s", height=0.7, color="color",
                            source=self.totals)
        self.by_source.x_range.start = 0
        for fig in (self.per_rank, self.blamed):
            fig.y_range.start = 0
            fig.legend.location = "top_left"
            fig.legend.orientation = "horizontal"
        hide_on_click(self.per_rank, self.blamed)
        self.message = Div()
        self.answer = Div(name="mdata-waiting-answer", styles={"font-size": "1.1em"})
        self.root = column(row(self.jobs.widget, self.message), self.answer, self.per_rank,
                           self.blamed, self.by_source, **kwargs)

    def update(self) -> None:
        runtime = self.jobs.current()
        self.message.text = job_message(self.scheduler, runtime)
        lines = {c: [] for c in LINES}
        dots = {c: [] for c in DOTS}
        totals = {c: [] for c in TOTALS}
        self.answer.text = ""
        if runtime is not None:
            figs = waiting_figures(runtime)
            self.answer.text = f"<b>{html.escape(figs['answer'])}</b>"
            names = figs["sources"]
            shade = {n: colour(i) for i, n in enumerate(names)}
            for rank, cols in figs["ranks"].items():
                lines["xs"].append(cols["step"])
                lines["ys"].append(cols["wait_s"])
                lines["rank"].append(f"rank {rank}")
                lines["color"].append(colour(int(rank)))
                for step, wait, source, at in zip(cols["step"], cols["wait_s"], cols["source"],
                                                  cols["time_s"]):
                    dots["step"].append(step)
                    dots["wait_s"].append(wait)
                    dots["rank"].append(rank)
                    dots["source_name"].append(source or NONE)
                    dots["time_s"].append(at)
                    dots["color"].append(shade.get(source, "#999999"))
            for source, wait in figs["wait_by_source"].items():
                totals["source_name"].append(source)
                totals["wait_s"].append(wait)
                totals["color"].append(shade.get(source, "#999999"))
            top_down = list(reversed(totals["source_name"]))  # the most blamed on top
            if list(self.by_source.y_range.factors) != top_down:
                self.by_source.y_range.factors = top_down
        self.lines.data = lines
        self.dots.data = dots
        self.totals.data = totals


def waiting_doc(scheduler, extra, doc) -> None:
    show(doc, WaitingPanel(scheduler, sizing_mode="stretch_both"), "waiting")
