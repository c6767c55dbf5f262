"""Balance panel: each DP rank's cost per step against the lower bound, and the imbalance.

A synchronous step takes as long as its most expensive rank; no assignment can beat the lower
bound ``max(total / ranks, largest sample)``. The first plot shows every rank's cost (dots) with
the lower bound (line); the second the ratio max / lower bound over time (1.0 is perfect). Costs
are in the cost model's unit: GPU-ms when it is calibrated to measured step times, else relative
(:func:`mdata.cost.cost_unit`); the axis says which. A plan balanced by pipeline stage shows each
rank's 1F1B makespan against the stage lower bound instead (the axis and titles say so), since
that is what it evens out.
"""

from __future__ import annotations

from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, Div
from bokeh.plotting import figure

from scheduler_plugins.dashboard.common import JobSelect, colour, hide_on_click, job_message, plot_title, show
from scheduler_plugins.dashboard.figures import balance_figures

COLUMNS = ("step", "rank", "rank_label", "cost", "color")
STEP_COLUMNS = ("step", "lower_bound", "max_cost", "mean_cost", "max_over_lower_bound", "max_over_mean")


def cost_title_text(measure: str) -> str:
    """The first plot's title, naming the measure (``cost`` or ``1F1B makespan``)."""
    return f"{measure} per DP rank (dots) vs lower bound (line); click a rank in the legend to hide it"


def imbalance_title_text(measure: str) -> str:
    """The second plot's title, naming the measure."""
    return f"imbalance: max {measure} / lower bound"


class BalancePanel:
    """Per-rank cost per step and imbalance over time for one job.

    The plots' titles name the measure, which :meth:`update` learns from the job, so the panel
    keeps its own ``Title`` objects and rewrites their text instead of reading ``fig.title`` back,
    which is a plain string when a plot is built from one while Bokeh's validation is off
    (:func:`~scheduler_plugins.dashboard.common.plot_title`).
    """

    def __init__(self, scheduler, job: str | None = None, *, last_steps: int = 1000, **kwargs) -> None:
        self.scheduler = scheduler
        self.last_steps = last_steps  # the browser redraws every point each second: keep it bounded
        self.jobs = JobSelect(scheduler, job)
        self.source = ColumnDataSource({c: [] for c in COLUMNS}, name="mdata-balance-ranks")  # (step, rank)
        self.step_source = ColumnDataSource({c: [] for c in STEP_COLUMNS}, name="mdata-balance-steps")
        self.cost_title = plot_title(cost_title_text("cost"))
        self.imbalance_title = plot_title(imbalance_title_text("cost"))
        self.cost = figure(title=self.cost_title, height=300, sizing_mode="stretch_width",
                           x_axis_label="step", y_axis_label="cost", tools="pan,wheel_zoom,reset")
        self.cost.line(x="step", y="lower_bound", color="black", line_width=2, legend_label="lower bound",
                       source=self.step_source)
        self.cost.scatter(x="step", y="cost", color="color", size=7, alpha=0.7,
                          legend_field="rank_label", source=self.source)
        self.cost.legend.location = "top_left"
        self.cost.legend.orientation = "horizontal"
        self.imbalance = figure(title=self.imbalance_title, height=260,
                                sizing_mode="stretch_width", x_axis_label="step",
                                tools="pan,wheel_zoom,reset")
        # the two ratios often coincide: a wide translucent line under a dashed one shows both
        self.imbalance.line(x="step", y="max_over_lower_bound", line_width=4, line_alpha=0.4,
                            color=colour(3), legend_label="max / lower bound", source=self.step_source)
        self.imbalance.line(x="step", y="max_over_mean", line_width=2, line_dash="dashed",
                            color=colour(0), legend_label="max / mean", source=self.step_source)
        self.imbalance.legend.location = "top_left"
        hide_on_click(self.cost, self.imbalance)
        self.message = Div()
        self.root = column(row(self.jobs.widget, self.message), self.cost, self.imbalance, **kwargs)

    def update(self) -> None:
        runtime = self.jobs.current()
        self.message.text = job_message(self.scheduler, runtime)
        if runtime is None:
            self.source.data = {c: [] for c in COLUMNS}
            self.step_source.data = {c: [] for c in STEP_COLUMNS}
            return
        figs = balance_figures(runtime, last=self.last_steps)
        measure = figs["measure"]
        label = f"{measure} ({figs['unit']})"
        if self.cost.yaxis[0].axis_label != label:
            self.cost.yaxis[0].axis_label = label
            self.cost_title.text = cost_title_text(measure)
            self.imbalance_title.text = imbalance_title_text(measure)
        data = {c: [] for c in COLUMNS}
        for step, costs in zip(figs["steps"], figs["per_rank_cost"]):
            for rank, cost in enumerate(costs):
                data["step"].append(step)
                data["rank"].append(rank)
                data["rank_label"].append(f"DP rank {rank}")
                data["cost"].append(cost)
                data["color"].append(colour(rank))
        self.source.data = data
        self.step_source.data = {c: list(figs[c if c != "step" else "steps"]) for c in STEP_COLUMNS}


def balance_doc(scheduler, extra, doc) -> None:
    show(doc, BalancePanel(scheduler, sizing_mode="stretch_both"), "balance")
