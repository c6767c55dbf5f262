"""A dashboard page that renames its plots works however Bokeh stored their titles.

``figure(title="...")`` makes a ``Title`` of the string only while Bokeh's property validation is
on, and that is one process-wide switch: distributed turns it off around every dashboard refresh
and Bokeh around its own class setup, saving and restoring it without a lock. A page built while
it is off keeps the plain string, and reading ``fig.title.text`` back raised AttributeError on the
balance page's first refresh (a 500 for that page, seen once in CI). The panel is built here with
validation off, as it was then, and needs no cluster: a stand-in scheduler holds one job.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("bokeh")

from bokeh.core.property.bases import validation_on  # noqa: E402
from bokeh.core.property.validation import validate  # noqa: E402
from bokeh.models import Title  # noqa: E402
from bokeh.plotting import figure  # noqa: E402

from scheduler_plugins.dashboard.balance import (BalancePanel, cost_title_text,  # noqa: E402
                                                 imbalance_title_text)
from scheduler_plugins.dashboard.common import plot_title  # noqa: E402

MEASURE = "1F1B makespan"


def scheduler_with_one_job(measure: str = MEASURE, unit: str = "GPU-ms"):
    """What the balance panel reads of a scheduler: the Planner's jobs, one with two steps."""
    steps = {s: {"step": s, "per_rank_cost": [3.0, 5.0], "lower_bound": 4.0,
                 "max_over_lower_bound": 1.25, "max_over_mean": 1.25, "measure": measure}
             for s in (0, 1)}
    runtime = SimpleNamespace(
        job="j", failure=None, view=SimpleNamespace(balanced_step=2, consumed_step=1),
        step_summaries=steps,
        plan=SimpleNamespace(mesh=SimpleNamespace(dp=2), cost_model=SimpleNamespace(unit=unit)))
    return SimpleNamespace(extensions={"mdata": SimpleNamespace(jobs={"j": runtime})})


def test_a_plot_built_from_a_string_with_validation_off_keeps_the_string():
    """Bokeh's behaviour the fix stands on: the string is converted only with validation on, an
    explicit ``Title`` is kept as given either way."""
    assert validation_on()
    assert isinstance(figure(title="t").title, Title)
    with validate(False):
        fig = figure(title="t")
        kept = plot_title("t")
        titled = figure(title=kept)
    assert validation_on()
    assert fig.title == "t" and not isinstance(fig.title, Title)
    with pytest.raises(AttributeError):
        fig.title.text = "renamed"  # what the balance page's update did
    assert titled.title is kept


@pytest.mark.parametrize("validation", [True, False], ids=["validation on", "validation off"])
def test_the_balance_panel_renames_its_plots_on_its_first_update(validation):
    with validate(validation):
        panel = BalancePanel(scheduler_with_one_job())
        panel.update()  # as the page does once, right after building it
    assert validation_on()
    assert panel.cost.title is panel.cost_title
    assert panel.imbalance.title is panel.imbalance_title
    assert panel.cost_title.text == cost_title_text(MEASURE)
    assert panel.imbalance_title.text == imbalance_title_text(MEASURE)
    assert panel.cost.yaxis[0].axis_label == f"{MEASURE} (GPU-ms)"
    assert list(panel.source.data["rank"]) == [0, 1, 0, 1]
    assert list(panel.step_source.data["step"]) == [0, 1]


def test_the_balance_panel_renames_again_when_the_measure_changes():
    scheduler = scheduler_with_one_job("cost")
    with validate(False):
        panel = BalancePanel(scheduler)
        panel.update()
        assert panel.cost_title.text == cost_title_text("cost")
        for step in scheduler.extensions["mdata"].jobs["j"].step_summaries.values():
            step["measure"] = MEASURE
        panel.update()  # a refresh: distributed runs it with validation off
    assert panel.cost.title is panel.cost_title
    assert panel.cost_title.text == cost_title_text(MEASURE)
    assert panel.imbalance_title.text == imbalance_title_text(MEASURE)
