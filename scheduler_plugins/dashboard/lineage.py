"""Lineage panel: type a sample id ``source/shard/row`` and read its story as a table.

Every occurrence of the sample (one per epoch it was planned in) appears with its events in
order: loaded (chunk, worker), planned (step, DP rank, micro-batch, position, tokens), delivered
and consumed (trainer ranks), over the whole run. The DGraph it reads is also written by the
Planner's planning thread while the job's lock is held, so a refresh that finds the lock taken keeps
the previous table and tries again at the next tick rather than read a step half recorded. Lineage
older than the DGraph's retention was spilled to files (:mod:`scheduler_plugins.lineage_store`):
a story that needs them is read in a thread, and the refresh after it finished shows it, so the
scheduler's event loop never waits on storage. When some of that lineage was let go (storage
failing past its retries or the pending cap, or retention), a line above the table says which steps
and why (:meth:`~scheduler_plugins.lineage_store.LineageStore.note`): a story of a sample planned
there lacks those occurrences.
"""

from __future__ import annotations

import time

from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, DataTable, Div, TableColumn, TextInput

from mdata.errors import MdataError
from mdata.lineage.ids import SampleId
from scheduler_plugins import stories
from scheduler_plugins.dashboard.common import JobSelect, job_message, show
from scheduler_plugins.dashboard.figures import STORY_COLUMNS, story_sample, story_table

INPUT_NAME = "mdata-lineage-input"
PLACEHOLDER = "source/shard/row"


def example_sample_id(runtime) -> str | None:
    """The first sample planned for DP rank 0 at the oldest balanced step: a useful placeholder.

    Reads the DGraph: call it with ``runtime.lock`` free (see the module docstring)."""
    graph = runtime.state.dgraph
    for step in sorted(runtime.step_summaries):
        ids = graph.samples(step, 0)
        if len(ids):
            info = graph.sample(int(ids[0]))
            return f"{info['source']}/{info['shard']}/{info['row']}"
    return None


class LineagePanel:
    """A sample id input and the story of that sample in one job."""

    def __init__(self, scheduler, job: str | None = None, sample_id: str = "", *,
                 refresh_s: float = 5.0, **kwargs) -> None:
        self.scheduler = scheduler
        # Finding a sample sorts the DGraph's id index again whenever it grew: on a big job that is
        # real work on the scheduler's loop, so an unchanged query is redone only every refresh_s.
        self.refresh_s = refresh_s
        self._last_query: tuple[str, str, float] | None = None
        self._reading = None  # (job, sample id, Future) of a story that reads spilled lineage
        self.jobs = JobSelect(scheduler, job)
        self.source = ColumnDataSource({c: [] for c in STORY_COLUMNS}, name="mdata-lineage-story")
        self.input = TextInput(title="sample id (source/shard/row), then Enter", value=sample_id,
                               placeholder=PLACEHOLDER, name=INPUT_NAME, width=320)
        self.input.on_change("value", lambda attr, old, new: self.update())
        self.table = DataTable(
            source=self.source, index_position=None, sizing_mode="stretch_both", min_height=200,
            columns=[TableColumn(field=c, title=c.replace("_", " "), width=220 if c == "worker" else 90)
                     for c in STORY_COLUMNS],
        )
        self.message = Div()
        self.result = Div()
        self.unavailable = Div(name="mdata-lineage-unavailable")  # lineage let go, if any
        self.root = column(row(self.jobs.widget, self.message), self.unavailable,
                           row(self.input, self.result), self.table, **kwargs)

    def update(self) -> None:
        runtime = self.jobs.current()
        self.message.text = job_message(self.scheduler, runtime)
        note = runtime.lineage.note() if runtime is not None and runtime.lineage is not None else ""
        self.unavailable.text = f"<b>{note}</b>" if note else ""
        if runtime is None:
            self.source.data = {c: [] for c in STORY_COLUMNS}
            return
        if runtime.lock.locked():
            return  # planning in progress: keep the table, the next tick retries (module docstring)
        if self.input.placeholder == PLACEHOLDER:
            example = example_sample_id(runtime)
            if example is not None:
                self.input.placeholder = f"e.g. {example}"
        sample_id = self.input.value.strip()
        if self._reading is not None and self._reading[:2] == (runtime.job, sample_id):
            future = self._reading[2]
            if future.done():  # the spilled lineage was read since the last refresh: show it
                self._reading = None
                self._show(runtime, sample_id, future)
            return
        self._reading = None  # another question now: its answer is not wanted any more
        now = time.monotonic()
        if (self._last_query is not None and self._last_query[:2] == (runtime.job, sample_id)
                and now - self._last_query[2] < self.refresh_s):
            return
        self._last_query = (runtime.job, sample_id, now)
        rows: list[dict] = []
        if not sample_id:
            self.result.text = "enter a sample id to see its story"
        else:
            try:
                query = stories.story_query(runtime, story_sample(runtime, sample_id))
            except MdataError as exc:
                self.result.text = f"<b>{exc}</b>"
            else:
                if query.ranges:  # spilled lineage: read in a thread, shown by a later refresh
                    self._reading = (runtime.job, sample_id, stories.submit(query))
                    self.result.text = (f"{sample_id}: reading lineage spilled in "
                                        f"{len(query.ranges)} file range(s)...")
                    return
                rows = self._describe(runtime, sample_id, story_table(query.run()))
        self._fill(rows)

    def _show(self, runtime, sample_id: str, future) -> None:
        try:
            rows = self._describe(runtime, sample_id, story_table(future.result()))
        except Exception as exc:  # storage unreachable, a file gone: say so on the page
            self.result.text = f"<b>reading spilled lineage failed: {exc}</b>"
            rows = []
        self._fill(rows)

    def _describe(self, runtime, sample_id: str, rows: list[dict]) -> list[dict]:
        n = len({r["lineage_id"] for r in rows})
        self.result.text = (f"{sample_id}: {n} occurrence(s), {len(rows)} event(s)" if rows
                            else f"<b>{stories.never_planned(runtime, SampleId.parse(sample_id))}</b>")
        return rows

    def _fill(self, rows: list[dict]) -> None:
        self.source.data = {
            c: [_cell(r[c]) for r in rows] for c in STORY_COLUMNS
        }


def _cell(value) -> str:
    """Table cells as text: absent fields blank, rank lists comma-separated."""
    if value is None:
        return ""
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return str(value)


def lineage_doc(scheduler, extra, doc) -> None:
    show(doc, LineagePanel(scheduler, sizing_mode="stretch_both"), "lineage")
