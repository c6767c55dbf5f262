"""Running mdata's command lines from end-to-end tests: what ``mdata cluster up`` prints, and
``benchmarks/run.py --quick`` with its figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

__all__ = ["printed_lines", "quick_benchmarks"]

REPO = Path(__file__).resolve().parents[1]


def printed_lines(proc: subprocess.Popen) -> dict[str, str]:
    """What ``mdata cluster up`` printed until it waits (``key: value`` per line)."""
    lines = {}
    for line in proc.stdout:
        key, _, value = line.partition(": ")
        lines[key] = value.strip()
        if line.startswith("press Ctrl-C"):
            break
    return lines


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
