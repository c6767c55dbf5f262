"""How a profile shows itself: a progress bar while it runs, a table when it is done.

Profiling a plan reads real rows of every source and can take a minute on image sources, so
``mdata profile`` says where it is. The bar is drawn on stderr with carriage returns when stderr is
a terminal (no extra dependency); in a log (CI, a notebook's captured stderr) it prints one line per
finished source instead, so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from mdata.profile import Profile, SourceProfile

__all__ = ["Progress", "profile_table"]

_WIDTH = 24


class Progress:
    """A one-line progress bar over sources, with the phase of the current one."""

    def __init__(self, total: int, *, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.total = max(1, int(total))
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if enabled is None else enabled
        self.finished = 0
        self.name = ""
        self.began = time.perf_counter()
        self._source_began = self.began

    def _bar(self) -> str:
        filled = int(_WIDTH * self.finished / self.total)
        return "[" + "#" * filled + "." * (_WIDTH - filled) + f"] {self.finished}/{self.total}"

    def _draw(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\x1b[2K" + text)
            self.stream.flush()

    def start(self, name: str) -> None:
        self.name, self._source_began = name, time.perf_counter()
        self._draw(f"profiling {self._bar()} {name}")

    def phase(self, phase: str) -> None:
        self._draw(f"profiling {self._bar()} {self.name}: {phase}")

    def done(self, profile: "SourceProfile") -> None:
        self.finished += 1
        seconds = time.perf_counter() - self._source_began
        line = (f"profiled {profile.name}: {profile.samples} samples, "
                f"{profile.seconds_per_sample * 1e3:.3g} ms/sample ({seconds:.1f} s)")
        if self.tty:
            self._draw(line + "\n")
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        self._draw(f"profiled {self.finished} source(s) in {time.perf_counter() - self.began:.1f} s\n")


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def profile_table(profile: "Profile") -> str:
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
