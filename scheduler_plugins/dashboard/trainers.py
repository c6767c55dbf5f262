"""Trainers panel: how long each trainer rank waited for its batches, and what it consumed.

A wait here is time a rank's prefetcher's request for its next batch was blocked on the Planner
because the batch was not built yet; it overlaps compute while the prefetcher is ahead. What the
training loop itself waited (the GPU time data cost), and the source each wait is blamed on, is
on the waiting page (:mod:`scheduler_plugins.dashboard.waiting`). Totals per rank sit beside the
steps each rank consumed; the line plot shows waits per step, so a stall is visible when it
happens. Under ``broadcast_at`` only the receiving ranks have figures: the ranks they broadcast
to tell the scheduler nothing per step, and follow their receiver.
"""

from __future__ import annotations

from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, Div, FactorRange
from bokeh.plotting import figure

from scheduler_plugins.dashboard.common import JobSelect, colour, hide_on_click, job_message, show
from scheduler_plugins.dashboard.figures import trainers_figures

COLUMNS = ("rank", "wait_s", "steps_consumed", "last_step", "color")
STEP_COLUMNS = ("xs", "ys", "rank", "color")


class TrainersPanel:
    """Per-rank wait time and steps consumed of one job."""

    def __init__(self, scheduler, job: str | None = None, **kwargs) -> None:
        self.scheduler = scheduler
        self.jobs = JobSelect(scheduler, job)
        self.source = ColumnDataSource({c: [] for c in COLUMNS}, name="mdata-trainers")  # per rank
        self.steps_source = ColumnDataSource({c: [] for c in STEP_COLUMNS}, name="mdata-trainers-steps")
        ranks = FactorRange()
        self.wait = figure(title="prefetcher's wait for batches (s) per rank (the loop's own: "
                           "waiting page)", x_range=ranks, height=240, x_axis_label="rank",
                           y_axis_label="seconds",
                           sizing_mode="stretch_width", tools="", toolbar_location=None)
        self.wait.vbar(x="rank", top="wait_s", width=0.8, color="color", source=self.source)
        self.consumed = figure(title="steps consumed per rank", x_range=ranks, height=240,
                               x_axis_label="rank", y_axis_label="steps",
                               sizing_mode="stretch_width", tools="", toolbar_location=None)
        self.consumed.vbar(x="rank", top="steps_consumed", width=0.8, color="color", source=self.source)
        for fig in (self.wait, self.consumed):
            fig.y_range.start = 0
        self.per_step = figure(title="prefetcher's wait per step (s), one line per rank: click a "
                               "rank in the legend to hide it", height=260, y_axis_label="seconds",
                               sizing_mode="stretch_width", x_axis_label="step",
                               tools="pan,wheel_zoom,reset")
        self.per_step.multi_line(xs="xs", ys="ys", line_color="color", line_width=2, line_alpha=0.7,
                                 legend_field="rank", source=self.steps_source)
        self.per_step.legend.location = "top_left"
        self.per_step.legend.orientation = "horizontal"
        hide_on_click(self.per_step)
        self.message = Div()
        self.root = column(row(self.jobs.widget, self.message),
                           row(self.wait, self.consumed, sizing_mode="stretch_width"), self.per_step,
                           **kwargs)

    def update(self) -> None:
        runtime = self.jobs.current()
        self.message.text = job_message(self.scheduler, runtime)
        data = {c: [] for c in COLUMNS}
        steps = {c: [] for c in STEP_COLUMNS}
        if runtime is not None:
            figs = trainers_figures(runtime)
            if figs["fed_by_broadcast"]:
                self.message.text += (f"; {figs['fed_by_broadcast']} ranks get their batch by "
                                      f"broadcast ({figs['broadcast']}) and follow their "
                                      "receiver: only receiving ranks are shown")
            labels = [str(r) for r in figs["rank"]]
            data = {"rank": labels, "wait_s": figs["wait_s"], "steps_consumed": figs["steps_consumed"],
                    "last_step": figs["last_step"], "color": [colour(r) for r in figs["rank"]]}
            for r, label in zip(figs["rank"], labels):
                by_step = figs["wait_by_step"][label]
                steps["xs"].append([int(s) for s in by_step])
                steps["ys"].append(list(by_step.values()))
                steps["rank"].append(f"rank {label}")
                steps["color"].append(colour(r))
            if list(self.wait.x_range.factors) != labels:
                self.wait.x_range.factors = labels
        self.source.data = data
        self.steps_source.data = steps


def trainers_doc(scheduler, extra, doc) -> None:
    show(doc, TrainersPanel(scheduler, sizing_mode="stretch_both"), "trainers")
