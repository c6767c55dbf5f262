"""Mixture panel: each source's target weight against the weight it really got, step by step.

Per-step shares wobble (a step holds a whole number of samples of each source); the cumulative
share is what an exact mixture keeps on target, so it gets its own plot. One line per source and
kind lives in a single long-form source; each plot selects the kinds it draws with a view.
"""

from __future__ import annotations

from bokeh.layouts import column, row
from bokeh.models import CDSView, ColumnDataSource, Div, GroupFilter
from bokeh.plotting import figure

from scheduler_plugins.dashboard.common import JobSelect, colour, hide_on_click, job_message, show
from scheduler_plugins.dashboard.figures import mixture_figures

COLUMNS = ("xs", "ys", "source_name", "kind", "color")
KINDS = ("target", "realized", "cumulative")
DASH = {"target": "dashed", "realized": "solid", "cumulative": "solid"}


class MixturePanel:
    """Target vs realized mixture weights over the balanced steps of one job."""

    def __init__(self, scheduler, job: str | None = None, *, last_steps: int = 1000, **kwargs) -> None:
        self.scheduler = scheduler
        self.last_steps = last_steps  # the browser redraws every line each second: keep it bounded
        self.jobs = JobSelect(scheduler, job)
        self.source = ColumnDataSource({c: [] for c in COLUMNS}, name="mdata-mixture-lines")
        self.per_step = self._plot("weight per step: realized (solid) vs target (dashed); click a "
                                   "source in the legend to hide it", "realized")
        self.cumulative = self._plot("cumulative weight: realized (solid) vs target (dashed)",
                                     "cumulative")
        self.message = Div()
        self.root = column(row(self.jobs.widget, self.message), self.per_step, self.cumulative, **kwargs)

    def _plot(self, title: str, kind: str):
        fig = figure(title=title, height=300, sizing_mode="stretch_width", x_axis_label="step",
                     y_axis_label="share of the step's samples", tools="pan,wheel_zoom,reset")
        fig.multi_line(xs="xs", ys="ys", line_color="color", line_dash="dashed", line_width=2,
                       line_alpha=0.5, source=self.source, view=_only("target"))
        fig.multi_line(xs="xs", ys="ys", line_color="color", line_width=2, line_alpha=0.8,
                       legend_field="source_name", source=self.source, view=_only(kind))
        fig.legend.location = "top_left"
        fig.legend.orientation = "horizontal"
        hide_on_click(fig)
        return fig

    def update(self) -> None:
        runtime = self.jobs.current()
        self.message.text = job_message(self.scheduler, runtime)
        data = {c: [] for c in COLUMNS}
        if runtime is not None:
            figs = mixture_figures(runtime, last=self.last_steps)
            for i, name in enumerate(figs["sources"]):
                for kind in KINDS:
                    data["xs"].append(figs["steps"])
                    data["ys"].append(figs[kind][name])
                    data["source_name"].append(name)
                    data["kind"].append(kind)
                    data["color"].append(colour(i))
        self.source.data = data


def _only(kind: str) -> CDSView:
    return CDSView(filter=GroupFilter(column_name="kind", group=kind))


def mixture_doc(scheduler, extra, doc) -> None:
    show(doc, MixturePanel(scheduler, sizing_mode="stretch_both"), "mixture")
