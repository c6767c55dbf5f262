"""Running mdata's command lines from end-to-end tests: what ``mdata cluster up`` prints, and
``benchmarks/run.py --quick`` with its figures."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["PrintedLines", "next_line", "printed_lines", "quick_benchmarks"]

REPO = Path(__file__).resolve().parents[1]


class PrintedLines(dict):
    """``key: value`` of each line ``mdata cluster up`` printed until it waits, in the order
    printed; ``proc`` is the command, whose later lines :func:`next_line` reads."""

    proc: subprocess.Popen | None = None


def printed_lines(proc: subprocess.Popen) -> PrintedLines:
    """What ``mdata cluster up`` printed until it waits (``key: value`` per line)."""
    lines = PrintedLines()
    lines.proc = proc
    for line in proc.stdout:
        key, _, value = line.partition(": ")
        lines[key] = value.strip()
        if line.startswith("press Ctrl-C"):
            break
    return lines


def next_line(proc: subprocess.Popen, starts: str, timeout: float) -> str:
    """The next line ``proc`` prints (after :func:`printed_lines`) that starts with ``starts``,
    within ``timeout`` seconds; an AssertionError with the lines it printed instead, if none."""
    if not hasattr(proc, "later_lines"):  # one reader for the rest of its output
        proc.later_lines = queue.Queue()
        threading.Thread(target=lambda: [proc.later_lines.put(line) for line in proc.stdout],
                         daemon=True).start()
    seen, deadline = [], time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = proc.later_lines.get(timeout=left).rstrip("\n")
        except queue.Empty:
            break
        if line.startswith(starts):
            return line
        seen.append(line)
    raise AssertionError(f"no line starting {starts!r} within {timeout:g}s; printed: {seen[-20:]}")


def quick_benchmarks(tmp_path: Path, *names: str, timeout: float) -> tuple[subprocess.CompletedProcess, dict]:
    """``benchmarks/run.py --quick --only NAMES`` in a subprocess: the finished process (its
    return code checked) and the figures it wrote as JSON."""
    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/run.py", "--quick", "--only", *names, "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc, json.loads(out.read_text())
