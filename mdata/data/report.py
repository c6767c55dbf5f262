"""What an example corpus holds: per-source counts and length distributions, as text and as a dict.

The corpus exists to give the planner and the benchmarks sources whose lengths differ the way real
training sources do, so the report shows those lengths in characters and in cl100k tokens (what
attention cost depends on), including how many documents exceed a 16k-token context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["CONTEXT_TOKENS", "SourceStats", "CorpusReport", "length_stats"]

#: The context length the report counts documents against ("over_context").
CONTEXT_TOKENS = 16384


@dataclass(frozen=True)
class SourceStats:
    """One source of the corpus: where it lies, its size and its length distribution.

    Character and token figures are of the ``text`` field (of the ``caption`` for image sources);
    ``median_pixels`` (of a frame, for video) is set for image and video sources only.
    """

    name: str
    kind: str  # "text", "image_caption" or "video_caption"
    rows: int
    shards: int
    row_groups: int
    bytes: int
    median_chars: float
    p90_chars: float
    max_chars: int
    median_tokens: float
    p90_tokens: float
    max_tokens: int
    over_context: int  # documents longer than CONTEXT_TOKENS tokens
    median_pixels: float | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SourceStats:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def length_stats(chars: Sequence[int], tokens: Sequence[int]) -> dict[str, float | int]:
    """Median, 90th percentile and maximum of per-document lengths, plus the count over context."""
    c = np.asarray(chars, dtype=np.int64)
    t = np.asarray(tokens, dtype=np.int64)
    if c.size == 0:
        return dict(median_chars=0.0, p90_chars=0.0, max_chars=0, median_tokens=0.0,
                    p90_tokens=0.0, max_tokens=0, over_context=0)
    return dict(
        median_chars=float(np.median(c)),
        p90_chars=float(np.percentile(c, 90)),
        max_chars=int(c.max()),
        median_tokens=float(np.median(t)),
        p90_tokens=float(np.percentile(t, 90)),
        max_tokens=int(t.max()),
        over_context=int((t > CONTEXT_TOKENS).sum()),
    )


@dataclass(frozen=True)
class CorpusReport:
    """The result of building (or finding) an example corpus."""

    dest: str
    size: str
    sources: tuple[SourceStats, ...]
    seconds: float  # wall time of this call
    reused: bool  # True when a complete corpus of this size was already there

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.sources)

    def source(self, name: str) -> SourceStats:
        """The stats of one source; KeyError names the sources there are."""
        for s in self.sources:
            if s.name == name:
                return s
        raise KeyError(f"no source {name!r} in the corpus at {self.dest}; it has "
                       f"{', '.join(s.name for s in self.sources)}")

    def stats(self) -> dict[str, Any]:
        """Everything in the report as plain JSON-able values, sources keyed by name."""
        return {
            "dest": self.dest,
            "size": self.size,
            "seconds": self.seconds,
            "reused": self.reused,
            "total_bytes": self.total_bytes,
            "context_tokens": CONTEXT_TOKENS,
            "sources": {s.name: asdict(s) for s in self.sources},
        }

    def to_text(self) -> str:
        """A table a person can read: one line per source, then the totals."""
        header = (f"{'source':<10} {'kind':<13} {'rows':>7} {'shards':>6} {'MB':>7} "
                  f"{'med chars':>9} {'med tok':>8} {'max tok':>8} {'>16k tok':>8}")
        lines = [f"example corpus ({self.size}) at {self.dest}", header, "-" * len(header)]
        for s in self.sources:
            lines.append(
                f"{s.name:<10} {s.kind:<13} {s.rows:>7} {s.shards:>6} {s.bytes / 1e6:>7.2f} "
                f"{s.median_chars:>9.0f} {s.median_tokens:>8.0f} {s.max_tokens:>8} "
                f"{s.over_context:>8}"
            )
        verb = "found complete, reused" if self.reused else "built"
        lines.append(
            f"{sum(s.rows for s in self.sources)} rows, {self.total_bytes / 1e6:.2f} MB; "
            f"{verb} in {self.seconds:.1f} s"
        )
        return "\n".join(lines)
