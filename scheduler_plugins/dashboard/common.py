"""What every panel shares: finding the Planner and its jobs, the job selector, colours.

The Planner plugin puts itself at ``scheduler.extensions["mdata"]`` when it starts; a page opened
before that (or on a scheduler without the preload) must say so instead of failing, so every
lookup here returns ``None`` rather than raising. Bokeh (the ``dashboard`` extra) is imported
only by the page code below, so the JSON routes, which share the lookups, run without it.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from mdata.observe.dashboard_pages import PAGES

if TYPE_CHECKING:
    from bokeh.models import Title

    from scheduler_plugins.job_runtime import JobRuntime

NO_PLANNER = "no mdata Planner on this scheduler (start it with --preload scheduler_plugins.planner)"
LATEST = "(latest job)"
NO_JOB = "no mdata job registered yet (mdata.driver.submit_job or a Loader with plan=)"


def planner(scheduler) -> Any | None:
    """The running :class:`~scheduler_plugins.planner.PlannerPlugin`, or ``None``."""
    return scheduler.extensions.get("mdata")


def job_names(scheduler) -> list[str]:
    """Registered jobs in registration order (the most recent last)."""
    plugin = planner(scheduler)
    return list(plugin.jobs) if plugin is not None else []


def find_job(scheduler, name: str | None) -> "JobRuntime | None":
    """Job ``name``, or the most recently registered one when ``name`` is None or gone."""
    plugin = planner(scheduler)
    if plugin is None or not plugin.jobs:
        return None
    if name is not None and name in plugin.jobs:
        return plugin.jobs[name]
    return plugin.jobs[next(reversed(plugin.jobs))]


def colour(i: int) -> str:
    from bokeh.palettes import Category10_10

    return Category10_10[i % len(Category10_10)]


#: The name of every page's header Div (title, purpose, links to the other pages).
HEADER_NAME = "mdata-page-header"


def header_html(title: str) -> str:
    """HTML of a page's header: "mdata: <title>", what the page answers, and a link to every other
    mdata page and to Dask's own status page. Links are relative to the page (``individual-...``)
    so they keep working behind a proxy or a dashboard prefix."""
    page = next(p for p in PAGES if p.title == title)
    links = " | ".join(
        f"<b>{html.escape(p.title)}</b>" if p is page else
        f'<a href="{p.route.lstrip("/")}">{html.escape(p.title)}</a>' for p in PAGES)
    return (f'<div style="font-size:1.4em;font-weight:bold">mdata: {html.escape(page.title)}</div>'
            f"<div>{html.escape(page.purpose)}</div>"
            f'<div>pages: {links} | <a href="status">Dask status</a></div>')


def header(title: str):
    """The Bokeh Div at the top of every mdata page (:func:`header_html`)."""
    from bokeh.models import Div

    return Div(text=header_html(title), name=HEADER_NAME, sizing_mode="stretch_width")


def plot_title(text: str) -> "Title":
    """A plot's title as an explicit Bokeh ``Title``. A page that changes a title later passes it
    as ``figure(title=...)``, keeps it and writes the kept object's ``text``, never ``fig.title``.

    ``figure(title="...")`` makes a ``Title`` of the string only while Bokeh's property validation
    is on: ``Property.prepare_value`` converts through ``Plot.title``'s ``accepts(String, ...)``
    only in its ``if validation_on():`` branch, and otherwise stores the value as given. That
    switch is one process-wide class attribute (``Property._should_validate``) that distributed
    turns off around every dashboard refresh (``without_property_validation``) and Bokeh around
    its own class setup, saving and restoring it without a lock; a plot built while any thread
    has it off keeps the plain string, and ``fig.title.text`` then raises AttributeError.
    """
    from bokeh.models import Title

    return Title(text=text)


def hide_on_click(*figures) -> None:
    """Legends whose entries hide their lines when clicked (overlapping lines stay readable)."""
    for fig in figures:
        for legend in fig.legend:
            legend.click_policy = "hide"
            legend.background_fill_alpha = 0.6


class JobSelect:
    """A job selector whose first choice follows the most recent job; any other choice pins a job.

    Following is its own option because choosing the job already shown would change nothing in the
    browser, and so could not pin it. Setting a Select's value from Python fires its ``on_change``
    callbacks like a user's choice would; a guard tells the two apart. A pinned job that is closed
    falls back to following.
    """

    def __init__(self, scheduler, job: str | None = None, **kwargs) -> None:
        self.scheduler = scheduler
        self.pinned = job
        self._refreshing = False
        from bokeh.models import Select

        self.widget = Select(title="job", options=[LATEST], value=LATEST, width=220, **kwargs)
        self.widget.on_change("value", self._chosen)

    def _chosen(self, attr, old, new) -> None:
        if not self._refreshing:
            self.pinned = None if new in (LATEST, "") else new

    def current(self) -> "JobRuntime | None":
        """Refresh the options and return the job to show."""
        names = job_names(self.scheduler)
        if self.pinned is not None and self.pinned not in names:
            self.pinned = None
        runtime = find_job(self.scheduler, self.pinned)
        options = [LATEST, *names]
        value = self.pinned if self.pinned is not None else LATEST
        self._refreshing = True
        try:
            if list(self.widget.options) != options:
                self.widget.options = options
            if self.widget.value != value:
                self.widget.value = value
        finally:
            self._refreshing = False
        return runtime


def show(doc, component, title: str, interval_ms: int = 1000) -> None:
    """Put a panel on a Bokeh document under its page header (:func:`header`) and refresh it every
    ``interval_ms``, as distributed does; ``title`` is the page's in :data:`PAGES`.

    The periodic callback holds the component through a weak reference (distributed's
    ``add_periodic_callback``), so a closed browser tab does not keep the panel alive.
    """
    from distributed.dashboard.components import add_periodic_callback
    from bokeh.layouts import column
    from distributed.dashboard.components.scheduler import BOKEH_THEME

    component.update()
    add_periodic_callback(doc, component, interval_ms)
    doc.add_root(column(header(title), component.root, sizing_mode="stretch_both"))
    doc.title = f"mdata: {title}"
    doc.theme = BOKEH_THEME


def job_message(scheduler, runtime: "JobRuntime | None") -> str:
    """One line above a panel: which job it shows and how far it is, or why it shows nothing."""
    if planner(scheduler) is None:
        return NO_PLANNER
    if runtime is None:
        return NO_JOB
    view = runtime.view  # the Planner's published snapshot (scheduler_plugins.planner_view)
    text = (f"job <b>{runtime.job}</b>: balanced {view.balanced_step} steps, "
            f"consumed {view.consumed_step}")
    if runtime.failure:
        text += f"; <b>failed</b>: {runtime.failure.splitlines()[0]}"
    return text
