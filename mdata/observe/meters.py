"""Counters behind the Planner's dashboard: per-source load throughput and backlog, trainer waits.

The Planner's decisions live in :mod:`mdata.planner`; these meters only *watch* what the
runtime does so that an operator can see it: how many samples each source delivers per second, how
many load tasks are still outstanding (a growing backlog means the pool is too small), how long
each trainer rank waited for its batch at each step and how many steps it consumed. They are pure
(the caller passes the clock), so they are tested without a cluster, and bounded: rates look at a
sliding window of recent loads and per-step waits keep only the newest steps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["SourceMeter", "SourceFigures", "LoadHistory", "TrainerMeter", "TrainerFigures"]


@dataclass(frozen=True)
class SourceFigures:
    """One source's load figures at one instant (see :meth:`SourceMeter.snapshot`)."""

    source: str
    loaded_samples: int
    loaded_chunks: int
    failed_chunks: int
    load_seconds: float
    backlog_chunks: int
    backlog_rows: int
    samples_per_s: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class SourceMeter:
    """Per-source loads requested, finished and failed, and recent samples per second.

    ``requested`` is called when a load task is submitted, ``loaded`` / ``failed`` when its outcome
    is known; the difference is the backlog. ``samples_per_s`` counts samples whose load finished in
    the last ``window_s`` seconds, divided by the window (or by the time since the meter started,
    while that is shorter, so a young job does not look slow).
    """

    def __init__(self, names: Sequence[str], *, now: float, window_s: float = 10.0) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0 seconds, got {window_s}")
        self.names = tuple(names)
        self._index = {name: i for i, name in enumerate(self.names)}
        self.window_s = float(window_s)
        self.started = float(now)
        n = len(self.names)
        self._loaded = [0] * n
        self._loaded_chunks = [0] * n
        self._failed = [0] * n
        self._seconds = [0.0] * n
        self._backlog = [0] * n
        self._backlog_rows = [0] * n
        self._recent: deque[tuple[float, int, int]] = deque()  # (time, source index, samples)

    def _i(self, source: str) -> int:
        try:
            return self._index[source]
        except KeyError:
            raise KeyError(f"source {source!r} is not metered; sources: {list(self.names)}") from None

    def requested(self, source: str, rows: int) -> None:
        """A load task for ``rows`` rows of ``source`` was submitted."""
        i = self._i(source)
        self._backlog[i] += 1
        self._backlog_rows[i] += int(rows)

    def loaded(self, source: str, *, rows: int, samples: int, seconds: float, now: float) -> None:
        """A load of ``rows`` requested rows finished with ``samples`` kept, in ``seconds``."""
        i = self._i(source)
        self._settle(i, rows)
        self._loaded[i] += int(samples)
        self._loaded_chunks[i] += 1
        self._seconds[i] += float(seconds)
        self._recent.append((float(now), i, int(samples)))
        self._trim(now)

    def failed(self, source: str, *, rows: int) -> None:
        """A load of ``rows`` requested rows raised; it leaves the backlog without samples."""
        i = self._i(source)
        self._settle(i, rows)
        self._failed[i] += 1

    def _settle(self, i: int, rows: int) -> None:
        # Never below zero: a load resubmitted after a lost worker may report twice.
        self._backlog[i] = max(0, self._backlog[i] - 1)
        self._backlog_rows[i] = max(0, self._backlog_rows[i] - int(rows))

    def _trim(self, now: float) -> None:
        horizon = float(now) - self.window_s
        while self._recent and self._recent[0][0] <= horizon:
            self._recent.popleft()

    def totals(self) -> tuple[np.ndarray, np.ndarray]:
        """Every source's samples loaded so far and load tasks outstanding, as two arrays in the
        plan's source order (what :class:`LoadHistory` samples, without a figure per source)."""
        return np.array(self._loaded, np.int64), np.array(self._backlog, np.int64)

    def snapshot(self, now: float) -> list[SourceFigures]:
        """Figures of every source, in the plan's source order."""
        self._trim(now)
        span = min(self.window_s, float(now) - self.started)
        recent = [0] * len(self.names)
        for _, i, samples in self._recent:
            recent[i] += samples
        return [
            SourceFigures(
                source=name,
                loaded_samples=self._loaded[i],
                loaded_chunks=self._loaded_chunks[i],
                failed_chunks=self._failed[i],
                load_seconds=self._seconds[i],
                backlog_chunks=self._backlog[i],
                backlog_rows=self._backlog_rows[i],
                samples_per_s=recent[i] / span if span > 0 else 0.0,
            )
            for i, name in enumerate(self.names)
        ]


class LoadHistory:
    """Per source, samples loaded so far and load tasks outstanding, sampled over time (once a
    second by the runtime) for the newest ``keep`` samples: the dashboard's loads-over-time.

    A sample keeps only the sources whose figures changed since the one before (and the oldest
    kept sample is whole), so a sample costs what changed, not one figure per source: kept as
    two tuples per sample, an hour of samples at 10,000 sources held about 1 GB, most of it
    sources that loaded nothing that second. Iterating gives every sample whole, oldest first.
    """

    def __init__(self, sources: int, *, keep: int = 3600) -> None:
        self.keep = max(1, int(keep))
        self._base_time: float | None = None  # the oldest kept sample, whole
        self._base = (np.zeros(sources, np.int64), np.zeros(sources, np.int64))
        self._last = (self._base[0].copy(), self._base[1].copy())  # the newest, whole
        # later samples: (time, sources that changed, their loaded, their outstanding)
        self._changes: deque[tuple[float, np.ndarray, np.ndarray, np.ndarray]] = deque()

    def add(self, t: float, loaded: np.ndarray, backlog: np.ndarray) -> None:
        """Sample every source's ``loaded`` and ``backlog`` (arrays in source order) at ``t``."""
        loaded = np.asarray(loaded, np.int64)
        backlog = np.asarray(backlog, np.int64)
        if self._base_time is None:
            self._base_time = float(t)
            self._base = (loaded.copy(), backlog.copy())
        else:
            changed = np.flatnonzero((loaded != self._last[0]) | (backlog != self._last[1]))
            self._changes.append((float(t), changed, loaded[changed], backlog[changed]))
            if len(self._changes) >= self.keep:  # fold the oldest change into the base
                t0, idx, ld, bl = self._changes.popleft()
                self._base_time = t0
                self._base[0][idx] = ld
                self._base[1][idx] = bl
        self._last = (loaded.copy(), backlog.copy())

    def __len__(self) -> int:
        return 0 if self._base_time is None else 1 + len(self._changes)

    def __iter__(self) -> Iterator[tuple[float, np.ndarray, np.ndarray]]:
        """``(time, loaded, outstanding)`` of every kept sample, oldest first (each its own
        arrays)."""
        if self._base_time is None:
            return
        loaded, backlog = self._base[0].copy(), self._base[1].copy()
        yield self._base_time, loaded.copy(), backlog.copy()
        for t, idx, ld, bl in list(self._changes):
            loaded[idx] = ld
            backlog[idx] = bl
            yield t, loaded.copy(), backlog.copy()


@dataclass(frozen=True)
class TrainerFigures:
    """One trainer rank's figures: total wait, steps consumed, the newest per-step waits."""

    rank: int
    wait_s: float
    steps_consumed: int
    last_step: int
    wait_by_step: dict[int, float]

    def to_dict(self) -> dict:
        out = dict(self.__dict__)
        out["wait_by_step"] = {str(k): v for k, v in self.wait_by_step.items()}
        return out


class TrainerMeter:
    """How long each trainer rank waited for its batch at each step, and what it consumed.

    A wait is the time a rank's request for a step's batch spent blocked because the batch was
    not built yet: the data pipeline's share of a stalled GPU. Per-step waits are shown for the
    newest ``keep_steps`` steps of each rank only (totals cover the whole run). A rank's steps
    are cut back to the newest ``keep_steps`` when they reach twice that, so a wait costs O(1)
    amortised: trimming one step at a time scanned every kept step for the oldest, on every
    rank's every step once a run had passed ``keep_steps`` steps.
    """

    def __init__(self, *, keep_steps: int = 1000) -> None:
        if keep_steps < 1:
            raise ValueError(f"keep_steps must be >= 1, got {keep_steps}")
        self.keep_steps = int(keep_steps)
        self._wait: dict[int, float] = {}
        self._by_step: dict[int, dict[int, float]] = {}
        self._consumed: dict[int, int] = {}
        self._last: dict[int, int] = {}

    def waited(self, rank: int, step: int, seconds: float) -> None:
        """``rank`` asked for the batch of ``step`` and was blocked ``seconds`` (0 when it was ready)."""
        rank, step = int(rank), int(step)
        self._wait[rank] = self._wait.get(rank, 0.0) + float(seconds)
        steps = self._by_step.setdefault(rank, {})
        steps[step] = steps.get(step, 0.0) + float(seconds)
        if len(steps) > 2 * self.keep_steps:  # cut back to the newest keep_steps at once
            for old in sorted(steps)[:-self.keep_steps]:
                del steps[old]

    def consumed(self, rank: int, step: int) -> None:
        """``rank`` acknowledged (consumed) the batch of ``step``."""
        rank, step = int(rank), int(step)
        self._consumed[rank] = self._consumed.get(rank, 0) + 1
        self._last[rank] = max(self._last.get(rank, -1), step)

    def consumed_many(self, step: int, ranks: Sequence[int]) -> None:
        """:meth:`consumed` of ``step`` for each of ``ranks`` (one message of many ranks)."""
        step = int(step)
        counts, last = self._consumed, self._last
        for rank in ranks:
            counts[rank] = counts.get(rank, 0) + 1
            if last.get(rank, -1) < step:
                last[rank] = step

    def waited_many(self, step: int, ranks: Sequence[int], seconds: Sequence[float]) -> None:
        """:meth:`waited` of ``step`` for each of ``ranks`` and its ``seconds``."""
        step = int(step)
        totals, by_step, keep = self._wait, self._by_step, self.keep_steps
        for rank, s in zip(ranks, seconds):
            s = float(s)
            totals[rank] = totals.get(rank, 0.0) + s
            steps = by_step.get(rank)
            if steps is None:
                steps = by_step[rank] = {}
            steps[step] = steps.get(step, 0.0) + s
            if len(steps) > 2 * keep:
                for old in sorted(steps)[:-keep]:
                    del steps[old]

    def snapshot(self) -> list[TrainerFigures]:
        """Figures of every rank seen so far, by rank."""
        ranks = sorted(set(self._wait) | set(self._consumed))
        return [
            TrainerFigures(
                rank=r,
                wait_s=self._wait.get(r, 0.0),
                steps_consumed=self._consumed.get(r, 0),
                last_step=self._last.get(r, -1),
                wait_by_step=dict(sorted(self._by_step.get(r, {}).items())[-self.keep_steps:]),
            )
            for r in ranks
        ]
