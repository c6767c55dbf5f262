"""Per-source cost profiles: what one sample of each source costs a loader, as measured.

A :class:`Profile` holds one :class:`SourceProfile` per source (time, memory and thread scaling
per sample; :mod:`mdata.pools.profiling` says how each figure is measured) and where it was
measured; it is saved as versioned JSON (``mdata profile PLAN`` writes one) and read back by the
offline pool layout (:mod:`mdata.pools.layout`). It shows itself as a table
(:meth:`Profile.table`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mdata.errors import PlanError

__all__ = ["PROFILE_VERSION", "Profile", "SourceProfile", "default_profile_path", "parallel_fraction",
           "profile_table"]

#: Version of the profile file; a newer file than this reader understands is refused.
PROFILE_VERSION = 1


def default_profile_path(plan_file: str | os.PathLike[str]) -> Path:
    """Where ``mdata profile PLAN`` writes its profile unless told (``--out``): ``PLAN_STEM.profile.json``
    beside the plan file, whatever the current directory, so the plan's profile is found where
    the plan is (``mdata cluster up --plan P --profile``, the docs' commands)."""
    plan_file = Path(plan_file)
    return plan_file.with_name(plan_file.stem + ".profile.json")


def parallel_fraction(speedup: float, threads: int) -> float:
    """Amdahl's parallel fraction ``p`` from a measured ``speedup`` on ``threads`` threads.

    ``speedup = 1 / ((1 - p) + p / threads)``; a transform that holds the GIL throughout has
    ``p = 0``, one that releases it throughout ``p = 1``. Clamped to [0, 1] (noise can push a
    measured speedup below 1 or above ``threads``).
    """
    if threads <= 1 or not speedup > 0:
        return 0.0
    p = (1.0 - 1.0 / speedup) / (1.0 - 1.0 / threads)
    return min(1.0, max(0.0, p))


@dataclass(frozen=True)
class SourceProfile:
    """What one sample of one source costs a loader (how each figure is measured:
    :mod:`mdata.pools.profiling`)."""

    name: str
    samples: int
    seconds_per_sample: float
    cpu_seconds_per_sample: float
    bytes_per_sample: float
    reader_bytes: int
    chunk_rows: int
    threads: int
    samples_per_s_1: float
    samples_per_s_n: float
    produces_images: bool = False
    decoder_bytes: int = 0

    def cost(self, basis: str = "cpu") -> float:
        """Seconds a loader thread spends per sample: ``"cpu"`` (process CPU time, unmoved by
        other programs competing for the cores) or ``"wall"`` (elapsed time, which also counts
        waiting on storage, and on the CPU when the profiling machine was busy)."""
        if basis == "cpu":
            return self.cpu_seconds_per_sample
        if basis == "wall":
            return self.seconds_per_sample
        raise PlanError(f"cost basis must be 'cpu' or 'wall', got {basis!r}")

    @property
    def task_seconds(self) -> float:
        """How long one load task (a chunk of ``chunk_rows`` samples) holds a loader thread."""
        return self.seconds_per_sample * self.chunk_rows

    @property
    def speedup(self) -> float:
        """Throughput with ``threads`` threads over one thread (1.0 when not measured)."""
        if self.threads <= 1 or not self.samples_per_s_1 > 0:
            return 1.0
        return self.samples_per_s_n / self.samples_per_s_1

    @property
    def parallel_fraction(self) -> float:
        """Amdahl's parallel fraction from :attr:`speedup` (0: the GIL serialises every thread)."""
        return parallel_fraction(self.speedup, self.threads)

    def to_dict(self) -> dict[str, Any]:
        """The profile of one source as JSON-safe data."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SourceProfile":
        """The profile :meth:`to_dict` wrote (fields it does not know are ignored: newer files)."""
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class Profile:
    """The profiles of a plan's sources, with where and when they were measured."""

    sources: tuple[SourceProfile, ...]
    host: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise PlanError(f"profile lists a source twice: {names}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.sources)

    def __getitem__(self, name: str) -> SourceProfile:
        for s in self.sources:
            if s.name == name:
                return s
        raise KeyError(f"no profile for source {name!r}; profiled: {list(self.names)}")

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def to_dict(self) -> dict[str, Any]:
        """The profiles as versioned JSON-safe data (what :meth:`save` writes)."""
        return {"mdata_profile": PROFILE_VERSION, "host": dict(self.host),
                "sources": [s.to_dict() for s in self.sources]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Profile":
        """The profile :meth:`to_dict` wrote; PlanError for no profile or a newer version."""
        version = data.get("mdata_profile")
        if not isinstance(version, int) or version < 1:
            raise PlanError(f"not an mdata profile (mdata_profile is {version!r}); write one with "
                            "`mdata profile PLAN`")
        if version > PROFILE_VERSION:
            raise PlanError(f"profile version {version} is newer than this mdata reads "
                            f"({PROFILE_VERSION}); upgrade mdata")
        return cls(tuple(SourceProfile.from_dict(s) for s in data["sources"]), dict(data.get("host", {})))

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the profile to ``path`` as JSON; returns the path."""
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "Profile":
        """The profile saved at ``path``; PlanError naming the file when it cannot be read."""
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PlanError(f"cannot read profile {str(path)!r}: {type(exc).__name__}: {exc}") from None

    def table(self) -> str:
        """A plain-text table, one row per source."""
        return profile_table(self)


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def profile_table(profile: Profile) -> str:
    """One row per source: per-sample wall and CPU time, bytes, reader and (video) decoder memory,
    throughput per thread with 1 and N threads, and the parallel fraction those imply."""
    head = ("source", "samples", "ms/sample", "cpu ms", "bytes/sample", "reader mem", "decoder mem",
            "samples/s 1 thr", "samples/s N thr", "speedup", "parallel")
    rows = [head]
    for s in profile.sources:
        rows.append((
            s.name, str(s.samples), f"{s.seconds_per_sample * 1e3:.3g}",
            f"{s.cpu_seconds_per_sample * 1e3:.3g}", _size(s.bytes_per_sample), _size(s.reader_bytes),
            _size(s.decoder_bytes) if s.decoder_bytes else "-",
            f"{s.samples_per_s_1:.4g}", f"{s.samples_per_s_n:.4g} ({s.threads})",
            f"{s.speedup:.2f}x", f"{s.parallel_fraction:.0%}",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = []
    for k, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    host = profile.host
    if host:
        lines.append(f"measured on {host.get('hostname', '?')} ({host.get('cpus', '?')} CPUs) at "
                     f"{host.get('measured_at', '?')}; N thr: one process, N threads loading at once")
    return "\n".join(lines)
