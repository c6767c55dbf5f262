"""A profile's progress bar while it runs (its table once done: :meth:`Profile.table
<mdata.pools.profile.Profile.table>`).

Profiling a plan reads real rows of every source and can take a minute on image sources, so
``mdata profile`` says where it is. The bar is drawn on stderr with carriage returns when stderr is
a terminal (no extra dependency); in a log (CI, a notebook's captured stderr) it prints one line per
finished source instead, so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from mdata.pools.profile import SourceProfile

__all__ = ["Progress"]

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

    def done(self, profile: SourceProfile) -> None:
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
