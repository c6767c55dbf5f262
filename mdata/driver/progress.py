"""How far a job got, read once from the Planner's status and shown three ways.

``mdata cluster status`` prints a job's lines, ``mdata demo`` moves a progress bar, and
``mdata cluster up`` keeps a live line per job while trainers run. All three read the same
figures out of ``JobHandle.status()`` through :class:`JobProgress` (the steps every rank
consumed, who waited, which sources wait on storage), so they never disagree on what a step
is. :class:`StepRate` turns successive readings into steps per second, :func:`live_line` writes
the one-line form, and :class:`StatusBoard` shows those lines: rewritten in place on a terminal,
printed when they change elsewhere (a log file stays readable). All of it is pure: tested
without a cluster.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

__all__ = ["JobProgress", "StatusBoard", "StepRate", "live_line"]


@dataclass(frozen=True)
class JobProgress:
    """The figures of one job's status that say how far it got and what holds it up.

    ``step``: steps every receiving rank consumed (the Planner's ``consumed_step``);
    ``waits``: per rank, seconds its prefetcher's requests waited for a batch not built yet;
    ``stalls``: per rank, seconds its training loop waited (what the GPU saw; told by the
    Loader with its acknowledgements); ``storage``: per source waiting on unreachable storage,
    since when (wall clock)."""

    job: str
    step: int
    balanced: int
    planned: int
    uptime_s: float
    failure: str | None
    waits: Mapping[int, float]
    stalls: Mapping[int, float]
    storage: Mapping[str, float]

    @classmethod
    def of(cls, status: Mapping[str, Any]) -> "JobProgress":
        """The progress in a ``JobHandle.status()`` dict (or a status reply's ``to_msg()``)."""
        c = status["counters"]
        return cls(
            job=str(status["job"]), step=int(c["consumed_step"]), balanced=int(c["balanced_step"]),
            planned=int(c["planned_step"]), uptime_s=float(status.get("uptime_s", 0.0)),
            failure=status.get("failure") or None,
            waits={int(r): float(w) for r, w in (status.get("trainer_wait_s") or {}).items()},
            stalls={int(r): float(w) for r, w in (status.get("trainer_stall_s") or {}).items()},
            storage={str(s): float(w["since"]) for s, w in (status.get("storage_waits") or {}).items()},
        )

    @property
    def ranks(self) -> int:
        """Trainer ranks heard from so far."""
        return len(set(self.waits) | set(self.stalls))

    @staticmethod
    def worst(figures: Mapping[int, float]) -> tuple[int, float] | None:
        """The rank with the largest figure and that figure; None when there is none."""
        if not figures:
            return None
        rank = max(figures, key=lambda r: (figures[r], -r))
        return rank, figures[rank]


class StepRate:
    """Steps per second over about the last ``window_s`` seconds of readings."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = float(window_s)
        self._seen: deque[tuple[float, int]] = deque()

    def add(self, now: float, step: int) -> float | None:
        """Record that ``step`` steps were done at ``now`` (monotonic seconds); the rate since
        the oldest reading kept, or None until two readings span some time."""
        self._seen.append((float(now), int(step)))
        while len(self._seen) > 2 and now - self._seen[1][0] >= self.window_s:
            self._seen.popleft()
        (t0, s0), (t1, s1) = self._seen[0], self._seen[-1]
        return None if t1 - t0 <= 0 else max(0, s1 - s0) / (t1 - t0)


def live_line(progress: JobProgress, rate: float | None, now: float) -> str:
    """One line for a terminal: step, steps/s, the exposed stall (the rank whose training loop
    waited most), ranks, and the sources waiting on storage (``now``: wall clock)."""
    head = f"job {progress.job!r}: step {progress.step}"
    if progress.failure:
        return f"{head}, FAILED: {progress.failure}"
    parts = [head, "- steps/s" if rate is None else f"{rate:.2f} steps/s"]
    if not progress.ranks:
        parts.append("no trainer attached yet")
    else:
        worst = JobProgress.worst(progress.stalls)
        stall = "stall 0.0s" if worst is None else f"stall {worst[1]:.1f}s (most: rank {worst[0]})"
        parts += [stall, f"{progress.ranks} rank{'s' if progress.ranks != 1 else ''}"]
    waiting = ", ".join(f"{source} (storage, {max(0.0, now - since):.0f}s)"
                        for source, since in sorted(progress.storage.items()))
    parts.append(f"sources waiting: {waiting or 'none'}")
    return ", ".join(parts)


class StatusBoard:
    """Shows one line per job on ``stream``.

    On a terminal (``tty``) the lines are rewritten in place at every :meth:`show`; anywhere else
    (a pipe, a log file) a job's line is printed only when it changed since it was last printed,
    so a log gets a line per change instead of one per refresh."""

    def __init__(self, stream: TextIO, tty: bool) -> None:
        self.stream = stream
        self.tty = tty
        self._shown = 0  # lines on screen (tty)
        self._last: dict[str, str] = {}  # job -> last line printed (not a tty)

    def show(self, lines: Mapping[str, str]) -> None:
        """Show ``lines`` (job name -> line), in job order as given."""
        if self.tty:
            out = f"\x1b[{self._shown}F" if self._shown else ""  # back to the first line shown
            out += "".join(f"\x1b[2K{line}\n" for line in lines.values())
            extra = self._shown - len(lines)
            if extra > 0:  # a job went away: blank its line, come back up
                out += "\x1b[2K\n" * extra + f"\x1b[{extra}F"
            self._shown = len(lines)
            self.stream.write(out)
        else:
            for job, line in lines.items():
                if self._last.get(job) != line:
                    self.stream.write(line + "\n")
                    self._last[job] = line
        self.stream.flush()
