"""A deterministic in-process runtime for PlannerState tests (no cluster, no sleeps).

It plays the parts the Dask side plays: loads chunks from SourceMetadata (real features per row,
including rows a loader would skip), and trainers that consume each step as soon as it is ready.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from mdata.metadata import SourceMetadata
from mdata.planner import (
    BatchConsumed, ChunkLoaded, ConstructStep, JobFailed, LoadChunk, MetricsReported,
    PlannerState, RanksConsumed, StepReady, Tick,
)


def lognormal_metadata(name: str, shards: int, rows: int, mu: float, seed: int,
                       bad_every: int = 0) -> SourceMetadata:
    """Generated token counts (metadata, not corpus text); every `bad_every`-th row is skipped."""
    rng = np.random.default_rng(seed)
    tokens = [np.clip(rng.lognormal(mu, 1.0, rows), 1, 60_000).astype(np.int32) for _ in range(shards)]
    skipped = None
    if bad_every:
        skipped = [(np.arange(rows) % bad_every) == (k % bad_every) for k in range(shards)]
    return SourceMetadata.from_arrays(name, tokens, skipped=skipped)


class Driver:
    """Feeds a PlannerState until a number of steps were consumed; records what it delivered."""

    def __init__(self, state: PlannerState, meta: dict[str, SourceMetadata],
                 metrics: Callable[[int, object], dict | None] | None = None,
                 on_consumed: Callable[[int], None] | None = None, bulk: bool = False) -> None:
        self.state = state
        self.bulk = bulk  # acknowledge each step with one RanksConsumed instead of one event per rank
        self.meta = meta
        self.metrics = metrics
        self.on_consumed = on_consumed
        self.queue = deque(state.handle(Tick(stimulus_id="start")))
        self.delivered: dict[int, dict[int, list[tuple[str, int, int]]]] = {}
        self.instructions: list = []
        self.receivers = sorted(r for d in range(state.mesh.dp)
                                for r in state.mesh.receivers(d, state.plan.broadcast))

    def run(self, until_step: int) -> "Driver":
        names = self.state.names
        while self.state.consumed_step < until_step:
            assert self.queue, "planner stalled"
            ins = self.queue.popleft()
            self.instructions.append(ins)
            if isinstance(ins, LoadChunk):
                ref = ins.chunk
                rows, tok, pat, bad = self.meta[ref.source].rows_of(ref.shard, ref.start, ref.stop)
                self.queue.extend(self.state.handle(ChunkLoaded(
                    ref, rows, tok, pat, bad.tolist(), f"w-{ref.source}",
                    stimulus_id=f"load-{ref.source}-{ref.chunk_id}")))
            elif isinstance(ins, ConstructStep):
                self.delivered.setdefault(ins.step, {}).update(
                    (dp, group.ids(names)) for dp, group in enumerate(ins.groups()))
            elif isinstance(ins, StepReady):
                s = ins.step
                if self.metrics is not None:
                    values = self.metrics(s, ins.summary)
                    if values:
                        self.queue.extend(self.state.handle(
                            MetricsReported(s, 0, values, stimulus_id=f"metrics-{s}")))
                if self.bulk:
                    self.queue.extend(self.state.handle(
                        RanksConsumed(s, tuple(self.receivers), stimulus_id=f"consumed-{s}")))
                else:
                    self.queue.extend(self.state.handle(
                        *(BatchConsumed(s, r, stimulus_id=f"consumed-{s}-{r}") for r in self.receivers)))
                if self.on_consumed is not None:
                    self.on_consumed(s)
            elif isinstance(ins, JobFailed):
                raise AssertionError(ins.reason)
        return self
