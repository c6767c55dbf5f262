"""The Planner's log: what each stimulus was and what it caused, described, not kept.

:class:`~mdata.planner.state.PlannerState` logs every event it handles so that a question after
the fact ("what did stimulus ``c-812`` do?") has an answer. The log used to keep the event and
its instructions themselves. At scale that held whole steps alive: an acknowledgement that lets
the Planner move on caused one construct instruction per DP group (each with its step's sample
arrays) and one ``ReleaseBatch``, and a log of 10,000 entries kept hundreds of steps of them. At
16,384 GPUs (DP 1,024) that was 1.6 GB and 2.5 million objects after 600 steps, which every full
garbage collection of the scheduler then walked (up to 0.4 s with the event loop held).

So an entry keeps a short description of the event (its class and its scalar fields; arrays and
long sequences by their length) and how many instructions of each kind it caused: bounded in
size whatever the mesh, and free of references into the Planner's state.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Sized
from typing import Any, NamedTuple

__all__ = ["LogEntry", "describe_event", "log_entry"]

#: Sequences up to this long are written out in a description; longer ones by their length.
SHOWN_ITEMS = 8


class LogEntry(NamedTuple):
    """One handled event: its ``stimulus_id``, the event described, and per instruction class
    (in the order first caused) how many instructions of it the event caused."""

    stimulus_id: str
    event: str
    instructions: tuple[tuple[str, int], ...]


def describe_event(event: Any) -> str:
    """``Class(field=value, ...)`` with the event's scalar fields, exceptions as their type and
    text, short tuples as they are and anything longer (arrays, rank lists) by its length."""
    parts = []
    for f in dataclasses.fields(event):
        if f.name == "stimulus_id":
            continue
        value = getattr(event, f.name)
        if value is None or isinstance(value, (bool, int, float, str)):
            parts.append(f"{f.name}={value!r}")
        elif isinstance(value, BaseException):
            parts.append(f"{f.name}={type(value).__name__}: {value}")
        elif isinstance(value, tuple) and len(value) <= SHOWN_ITEMS:
            parts.append(f"{f.name}={value!r}")
        elif isinstance(value, Sized):
            parts.append(f"{f.name}=<{len(value)} items>")
        else:
            parts.append(f"{f.name}=<{type(value).__name__}>")
    return f"{type(event).__name__}({', '.join(parts)})"


def log_entry(event: Any, instructions: Iterable[Any]) -> LogEntry:
    """The entry of ``event``, which caused ``instructions``."""
    counts = Counter(type(i).__name__ for i in instructions)
    return LogEntry(event.stimulus_id, describe_event(event), tuple(counts.items()))
