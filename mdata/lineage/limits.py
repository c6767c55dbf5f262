"""How much spilled lineage a job may hold, and what it says when it had to let some go.

Lineage older than the DGraph's retention is written to files by a thread on the scheduler
(``scheduler_plugins/lineage_store.py``). Storage can fail for hours and a run can last weeks, so
neither the ranges waiting in memory nor the files may grow without bound. Lineage is a record
for people, not an input of training: when a bound is reached the oldest lineage goes, training
goes on unchanged, and the job's status and the dashboard say which steps' lineage is gone and why.

This module decides (the store only carries the decisions out):

* :meth:`SpillLimits.over_pending`: which pending ranges to drop so memory stays under
  ``mdata.planner.lineage-spill-pending`` (the oldest first; never the range being written);
* :meth:`SpillLimits.retry_delay`: how long to wait before writing a range again, and when to
  give up on it (``mdata.planner.lineage-spill-retries`` failed attempts);
* :meth:`SpillLimits.expired`: which written ranges retention deletes
  (``lineage-spill-keep-steps``: the newest steps kept; ``lineage-spill-keep-bytes``: the
  files' budget), the oldest first;
* :class:`LineageGaps`: the steps whose lineage is unavailable, and the sentence that says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Hashable, TypeVar

from mdata.errors import MdataError

__all__ = ["SpillLimits", "WrittenRange", "LineageGap", "LineageGaps", "WRITE_FAILED",
           "PENDING_CAP", "RETENTION", "format_bytes"]

K = TypeVar("K", bound=Hashable)

WRITE_FAILED = "write-failed"
PENDING_CAP = "pending-cap"
RETENTION = "retention"
_REASONS = (WRITE_FAILED, PENDING_CAP, RETENTION)


def format_bytes(n: int) -> str:
    """``1.5 MiB``: sizes in the sentences people read."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _limit(key: str, value: Any, parse: Callable[[Any], int]) -> int | None:
    """A non-negative limit from the configuration; None (or "null") means unbounded."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "null", "none")):
        return None
    try:
        out = int(parse(value))
    except (TypeError, ValueError) as exc:
        raise MdataError(f"mdata.planner.{key} must be a number or null, got {value!r} ({exc})") from None
    if out < 0:
        raise MdataError(f"mdata.planner.{key} must be >= 0 or null, got {value!r}")
    return out


@dataclass(frozen=True)
class WrittenRange:
    """What retention needs to know of one written range: its key, steps and files' size."""

    key: Hashable
    first_step: int
    stop_step: int
    nbytes: int


@dataclass(frozen=True)
class SpillLimits:
    """The bounds of one job's spilled lineage (None: unbounded). See the module docstring."""

    pending_bytes: int | None = 1 << 30
    retries: int | None = 15
    keep_steps: int | None = None
    keep_bytes: int | None = 4 << 30
    retry_initial_s: float = 0.5
    retry_max_s: float = 30.0

    @classmethod
    def from_config(cls, get: Callable[[str], Any], parse_bytes: Callable[[Any], int]) -> "SpillLimits":
        """The limits under ``mdata.planner.`` (``get("lineage-spill-pending")``...); sizes go
        through ``parse_bytes`` (``"1 GiB"``). A bad value raises MdataError naming its key."""
        return cls(pending_bytes=_limit("lineage-spill-pending", get("lineage-spill-pending"), parse_bytes),
                   retries=_limit("lineage-spill-retries", get("lineage-spill-retries"), int),
                   keep_steps=_limit("lineage-spill-keep-steps", get("lineage-spill-keep-steps"), int),
                   keep_bytes=_limit("lineage-spill-keep-bytes", get("lineage-spill-keep-bytes"), parse_bytes))

    def retry_delay(self, failures: int) -> float | None:
        """The pause before attempt ``failures + 1`` of one range (doubling from
        ``retry_initial_s`` up to ``retry_max_s``), or None: it failed ``retries`` times, drop it."""
        if self.retries is not None and failures >= self.retries:
            return None
        return min(self.retry_initial_s * 2 ** max(0, failures - 1), self.retry_max_s)

    def over_pending(self, pending: Sequence[tuple[K, int]], busy: K | None = None) -> list[K]:
        """Keys of the ranges to drop, oldest first, so that the bytes of ``pending`` ((key,
        bytes) in spill order, the newest last) fit under ``pending_bytes``. ``busy``, the range
        the writer is writing now, is never chosen (the writer drops it itself when it gives up),
        so the newest one may be: memory stays under the cap whatever the writer does."""
        if self.pending_bytes is None:
            return []
        total = sum(n for _, n in pending)
        out = []
        for key, n in pending:
            if total <= self.pending_bytes:
                break
            if key != busy:
                out.append(key)
                total -= n
        return out

    def expired(self, written: Sequence[WrittenRange]) -> list[Hashable]:
        """Keys of the written ranges retention deletes, oldest (spill order) first: those that
        end ``keep_steps`` or more steps before the newest written step, then the oldest until
        the files fit in ``keep_bytes``."""
        out: list[Hashable] = []
        if not written:
            return out
        kept = list(written)
        if self.keep_steps is not None:
            newest = max(r.stop_step for r in kept)
            out = [r.key for r in kept if r.stop_step <= newest - self.keep_steps]
            kept = [r for r in kept if r.key not in out]
        if self.keep_bytes is not None:
            total = sum(r.nbytes for r in kept)
            for r in kept:
                if total <= self.keep_bytes:
                    break
                out.append(r.key)
                total -= r.nbytes
        return out

    def describe(self, reason: str) -> str:
        """Why lineage of a given reason went, in the words of the configuration."""
        if reason == PENDING_CAP:
            cap = "none" if self.pending_bytes is None else format_bytes(self.pending_bytes)
            return f"more than mdata.planner.lineage-spill-pending ({cap}) waited in memory for storage"
        if reason == RETENTION:
            parts = ([f"lineage-spill-keep-steps {self.keep_steps}"] if self.keep_steps is not None else []) + \
                    ([f"lineage-spill-keep-bytes {format_bytes(self.keep_bytes)}"]
                     if self.keep_bytes is not None else [])
            return f"its files were deleted by retention ({', '.join(parts) or 'none'})"
        return f"writing it failed {self.retries} time(s) (mdata.planner.lineage-spill-retries)"


@dataclass(frozen=True)
class LineageGap:
    """Steps ``[first_step, stop_step)`` whose spilled lineage is unavailable, why (one of
    ``write-failed``, ``pending-cap``, ``retention``), and the last detail (an error, a limit)."""

    first_step: int
    stop_step: int
    reason: str
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"first_step": self.first_step, "stop_step": self.stop_step, "reason": self.reason,
                "detail": self.detail}


def _merged(spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


@dataclass
class LineageGaps:
    """The unavailable lineage of one job: per reason, the merged step ranges and last detail.

    Small whatever the run's length: overlapping and adjacent ranges of one reason merge."""

    _spans: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    _detail: dict[str, str] = field(default_factory=dict)

    def add(self, first_step: int, stop_step: int, reason: str, detail: str = "") -> None:
        if reason not in _REASONS:
            raise ValueError(f"unknown lineage gap reason {reason!r}; one of {_REASONS}")
        if stop_step <= first_step:
            return
        self._spans[reason] = _merged([*self._spans.get(reason, []), (int(first_step), int(stop_step))])
        if detail:
            self._detail[reason] = detail

    def gaps(self) -> tuple[LineageGap, ...]:
        """Every gap, by first step (then reason)."""
        out = [LineageGap(a, b, reason, self._detail.get(reason, ""))
               for reason, spans in self._spans.items() for a, b in spans]
        return tuple(sorted(out, key=lambda g: (g.first_step, g.reason)))

    def __bool__(self) -> bool:
        return bool(self._spans)

    def describe(self, limits: SpillLimits | None = None) -> str:
        """One sentence for status and dashboard; empty while every spilled step is told.

        ``lineage older than step N unavailable`` when the gaps cover every step before N,
        else the step ranges; then why, per reason."""
        if not self._spans:
            return ""
        spans = _merged([s for spans in self._spans.values() for s in spans])
        if len(spans) == 1 and spans[0][0] == 0:
            where = f"lineage older than step {spans[0][1]} unavailable"
        else:
            shown = ", ".join(f"{a}-{b - 1}" for a, b in spans[-4:])
            where = f"lineage of steps {'..., ' if len(spans) > 4 else ''}{shown} unavailable"
        limits = limits or SpillLimits()
        why = []
        for reason in _REASONS:
            if reason in self._spans:
                detail = self._detail.get(reason, "")
                why.append(limits.describe(reason) + (f": {detail}" if detail else ""))
        return (f"{where} ({'; '.join(why)}); stories of samples planned there lack those "
                f"occurrences, training is unaffected")
