"""Reading what ``mdata cluster up`` prints, for the end-to-end tests that start it."""

from __future__ import annotations

import subprocess

__all__ = ["printed_lines"]


def printed_lines(proc: subprocess.Popen) -> dict[str, str]:
    """What ``mdata cluster up`` printed until it waits (``key: value`` per line)."""
    lines = {}
    for line in proc.stdout:
        key, _, value = line.partition(": ")
        lines[key] = value.strip()
        if line.startswith("press Ctrl-C"):
            break
    return lines
