"""What a sample's story is made of, shared by the in-memory DGraph and its spilled files.

A story (:meth:`mdata.lineage.dgraph.DGraph.story`) is built from rows of four lineage tables:
the chunk loads of the sample's chunk, its planned row, and the delivery and consumption rows of
its step and DP rank. The same rows live either in the DGraph's numpy columns or, once a long run spilled
them, in Parquet files (:mod:`mdata.lineage.spill`); building the events with the functions here
from either place makes a spilled story identical to the one the DGraph would have told.

Every event carries the DGraph's sequence number of what it records (``seq``), so events from
both places sort into one chronological story. :class:`LineageSegment` is the unit that leaves
memory: the rows of a range of steps, plain numpy, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["LineageSegment", "loaded_events", "planned_event", "rank_story", "occurrence_story",
           "chronological", "DELIVERED", "CONSUMED",
           "SAMPLE_COLUMNS", "LOAD_COLUMNS", "RANK_COLUMNS", "SKIP_COLUMNS"]

SAMPLE_COLUMNS = {
    "source_index": np.int32,
    "shard": np.int32,
    "row": np.int64,
    "chunk_id": np.int64,
    "cursor": np.int64,  # position in the source's infinite order: gaps and repeats show here
    "step": np.int64,
    "dp_rank": np.int32,
    "micro_batch": np.int32,
    "position": np.int32,
    "num_tokens": np.int32,
}
LOAD_COLUMNS = {"source_index": np.int32, "chunk_id": np.int64, "worker": np.int32, "seq": np.int64}
RANK_COLUMNS = {"step": np.int64, "dp_rank": np.int32, "rank": np.int32, "kind": np.int8, "seq": np.int64}
SKIP_COLUMNS = {"source_index": np.int32, "shard": np.int32, "row": np.int64, "cursor": np.int64,
                "step": np.int64}
DELIVERED, CONSUMED = 0, 1

Event = tuple[int, dict[str, Any]]


@dataclass(frozen=True)
class LineageSegment:
    """The lineage of steps ``[first_step, stop_step)`` taken out of a DGraph's memory.

    ``samples`` has the sample columns plus ``lineage_id`` and ``plan_seq`` (when its step was
    planned); ``loads`` has ``source_index``, ``chunk_id``, ``worker`` (the worker's address, a
    string) and ``seq`` for every load with ``seq < loads_before``; ``rank_events`` and ``skips``
    are the rows of those steps. Lineage ids ``[first_id, stop_id)`` are the samples'.
    """

    sources: tuple[str, ...]
    first_step: int
    stop_step: int
    first_id: int
    stop_id: int
    loads_before: int
    samples: Mapping[str, np.ndarray]
    loads: Mapping[str, np.ndarray]
    rank_events: Mapping[str, np.ndarray]
    skips: Mapping[str, np.ndarray]

    def __len__(self) -> int:
        return self.stop_id - self.first_id

    @property
    def empty(self) -> bool:
        return not (len(self) or any(len(t["seq"]) for t in (self.loads, self.rank_events))
                    or len(self.skips["step"]))


def sample_info(row: Mapping[str, Any], sources: tuple[str, ...]) -> dict[str, Any]:
    """A samples-table row as plain ints, with the source's name (what the events read)."""
    info = {name: int(row[name]) for name in SAMPLE_COLUMNS}
    info["source"] = sources[info["source_index"]]
    return info


def loaded_events(info: Mapping[str, Any], workers: np.ndarray | list, seqs: np.ndarray) -> list[Event]:
    """One ``loaded`` event per load of the sample's chunk (``workers`` are addresses)."""
    return [(int(seq), {"event": "loaded", "source": info["source"], "shard": info["shard"],
                        "row": info["row"], "chunk": info["chunk_id"], "worker": str(worker)})
            for worker, seq in zip(workers, seqs)]


def planned_event(info: Mapping[str, Any], plan_seq: int) -> Event:
    return (int(plan_seq), {
        "event": "planned", "step": info["step"], "dp_rank": info["dp_rank"],
        "micro_batch": info["micro_batch"], "position": info["position"],
        "num_tokens": info["num_tokens"], "cursor": info["cursor"],
    })


def rank_story(info: Mapping[str, Any], kind: np.ndarray, rank: np.ndarray, seq: np.ndarray) -> list[Event]:
    """``delivered`` and ``consumed`` events from the rank rows of the sample's step and DP rank:
    each at the first such row, with every rank that had one."""
    out = []
    for code, label in ((DELIVERED, "delivered"), (CONSUMED, "consumed")):
        idx = np.flatnonzero(kind == code)
        if idx.size:
            out.append((int(seq[idx].min()), {
                "event": label, "step": info["step"], "dp_rank": info["dp_rank"],
                "ranks": sorted({int(r) for r in rank[idx]}),
            }))
    return out


def chronological(events: list[Event]) -> list[dict[str, Any]]:
    """The events in the order they happened (stable for equal sequence numbers)."""
    return [e for _, e in sorted(events, key=lambda e: e[0])]


def occurrence_story(events: list[Event]) -> list[dict[str, Any]]:
    """The story of one occurrence of a sample, in order: the loads of its chunk that served it
    (the last one before it was planned, and reloads after a lost worker until it was consumed),
    then its planning, delivery and consumption. Loads of the same chunk in other epochs (before
    or after) belong to other occurrences' stories; over a whole run there are many."""
    plan = next((q for q, e in events if e["event"] == "planned"), None)
    if plan is None:
        return chronological(events)
    end = min((q for q, e in events if e["event"] == "consumed"), default=None)
    start = max((q for q, e in events if e["event"] == "loaded" and q < plan), default=plan)
    return chronological([(q, e) for q, e in events if e["event"] != "loaded"
                          or (start <= q and (end is None or q <= end))])
