"""Is training waiting on data, on which rank, on which source? A ledger of exposed waits.

An *exposed* wait is the time a rank's training loop spent blocked in the Loader for a step's
batch (not its prefetcher's long polls, which overlap compute): the GPU time data cost. Loaders
tell each consumed step's wait with the consumption (``waits`` beside ``steps`` on the wire), and
this ledger keeps them per ``(rank, step)`` with the source each wait is attributed to.

The attribution rule (:func:`attribute`): a step is planned once the chunks its samples come from
are loaded, so a late batch waited for the chunk that arrived last. The source blamed is

1. a source of the step whose loads wait on unreachable storage when the wait is told (an outage
   is what the user has to fix, whatever loaded last), else
2. the source whose chunks for the step were loaded last: the step's chunks over every DP rank,
   since the Planner balances a step as a whole, so one rank's batch can wait for a chunk that
   only another rank's batch reads.

The ledger learns the inputs as the scheduler sees them: when a chunk finished loading
(:meth:`DataWaitLedger.loaded`) and which chunks a step's batch is built from
(:meth:`DataWaitLedger.planned`); it turns them into each source's last load time per step at
once, so chunks can be forgotten when released. Waits shorter than
``min_wait_s`` are kept but blamed on no source (a queue hand-off is not a data stall). Everything
is bounded: the ``keep_steps`` steps seen last of inputs and waits, at most ``keep_waits`` waits
(fewer steps on a wide mesh: a wait per rank and step adds up), ``keep_chunks`` chunk times.
Pure: no clock of its own (times are arguments), no Dask.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

__all__ = ["DataWait", "DataWaitLedger", "attribute", "UNKNOWN"]

#: The source of a wait whose step's inputs the ledger does not know (planned before it kept them).
UNKNOWN = "(unknown)"


def attribute(last_loaded: Mapping[str, float], storage_waiting: Collection[str] = ()) -> str:
    """The source a late batch is blamed on (module docstring): a source of the step waiting on
    storage (the latest loaded of them when several), else the one whose chunks loaded last;
    :data:`UNKNOWN` when the step's loads are not known. Ties go to the first source named."""
    if not last_loaded:
        return UNKNOWN
    waiting = [s for s in last_loaded if s in storage_waiting]
    candidates = waiting or list(last_loaded)
    return max(candidates, key=lambda s: last_loaded[s])


@dataclass(frozen=True)
class DataWait:
    """One rank's exposed wait for one step's batch: seconds, the source blamed ("" when the wait
    is too short to blame anyone), and when it was told (seconds on the caller's clock)."""

    rank: int
    step: int
    wait_s: float
    source: str
    told_at: float

    def to_dict(self) -> dict:
        return asdict(self)


class DataWaitLedger:
    """Exposed waits per ``(rank, step)`` with their sources (see the module docstring)."""

    def __init__(self, *, min_wait_s: float = 0.005, keep_steps: int = 2000, keep_waits: int = 100_000,
                 keep_chunks: int = 100_000) -> None:
        self.min_wait_s = float(min_wait_s)
        self.keep_steps = max(1, int(keep_steps))
        self.keep_waits = max(1, int(keep_waits))
        self._count = 0  # waits kept
        self.keep_chunks = max(1, int(keep_chunks))
        self._chunks: OrderedDict[Hashable, tuple[str, float]] = OrderedDict()
        # step -> source -> when its last chunk for that step was loaded; and
        # step -> rank -> its wait. Steps in the order first seen, which is nearly always ascending
        # (a rewind plans old steps again): the oldest seen go first past ``keep_steps``.
        self._inputs: dict[int, dict[str, float]] = {}
        self._waits: dict[int, dict[int, DataWait]] = {}
        # step -> (sources waiting on storage, the source blamed): every rank of a step waits for
        # the same chunks, so the blame is worked out once per step, not once per rank over each
        # of the step's sources (thousands of ranks times hundreds of sources)
        self._blamed: dict[int, tuple[frozenset[str], str]] = {}

    # -- inputs ----------------------------------------------------------------------------------
    def loaded(self, chunk: Hashable, source: str, at: float) -> None:
        """``chunk`` of ``source`` finished loading at ``at`` (a reload moves the time)."""
        self._chunks.pop(chunk, None)
        self._chunks[chunk] = (source, float(at))
        while len(self._chunks) > self.keep_chunks:
            self._chunks.popitem(last=False)

    def forget(self, chunk: Hashable) -> None:
        """``chunk`` was released: no later batch reads it."""
        self._chunks.pop(chunk, None)

    def planned(self, step: int, chunks: Iterable[Hashable]) -> None:
        """One of ``step``'s batches is built from ``chunks``: note each source's last load (over
        every batch of the step told so far)."""
        last = self._inputs.setdefault(int(step), {})
        for chunk in chunks:
            known = self._chunks.get(chunk)
            if known is not None:
                source, at = known
                last[source] = max(at, last.get(source, at))
        self._blamed.pop(int(step), None)  # its inputs changed
        self._trim(self._inputs)

    def inputs(self, step: int) -> dict[str, float]:
        """Each source's last load time for ``step``'s chunks; empty if unknown."""
        return dict(self._inputs.get(int(step), {}))

    # -- waits -----------------------------------------------------------------------------------
    def waited(self, rank: int, step: int, wait_s: float, *, at: float,
               storage_waiting: Collection[str] = ()) -> DataWait:
        """Rank ``rank`` waited ``wait_s`` for step ``step``'s batch, told at ``at`` while
        ``storage_waiting`` sources waited on storage; returns the record."""
        wait_s = max(0.0, float(wait_s))
        source = "" if wait_s < self.min_wait_s else self._blame(int(step), storage_waiting)
        record = DataWait(int(rank), int(step), wait_s, source, float(at))
        by_rank = self._waits.setdefault(record.step, {})
        self._count += record.rank not in by_rank
        by_rank[record.rank] = record
        while len(self._waits) > 1 and (len(self._waits) > self.keep_steps
                                        or self._count > self.keep_waits):
            self._count -= len(self._waits.pop(next(iter(self._waits))))
        return record

    def waited_many(self, step: int, ranks: Sequence[int], waits: Sequence[float], *, at: float,
                    storage_waiting: Collection[str] = ()) -> None:
        """:meth:`waited` for several ranks of one ``step`` at once (a message of every rank of
        a host): the step's blame worked out once, the kept waits trimmed once."""
        step, at = int(step), float(at)
        by_rank = self._waits.setdefault(step, {})
        blamed: str | None = None
        for rank, wait_s in zip(ranks, waits):
            wait_s = max(0.0, float(wait_s))
            if wait_s < self.min_wait_s:
                source = ""
            else:
                if blamed is None:
                    blamed = self._blame(step, storage_waiting)
                source = blamed
            rank = int(rank)
            self._count += rank not in by_rank
            by_rank[rank] = DataWait(rank, step, wait_s, source, at)
        while len(self._waits) > 1 and (len(self._waits) > self.keep_steps
                                        or self._count > self.keep_waits):
            self._count -= len(self._waits.pop(next(iter(self._waits))))

    def _blame(self, step: int, storage_waiting: Collection[str]) -> str:
        """:func:`attribute` for ``step``, remembered until its inputs or the storage waits change."""
        waiting = frozenset(storage_waiting)
        known = self._blamed.get(step)
        if known is not None and known[0] == waiting:
            return known[1]
        source = attribute(self._inputs.get(step, {}), waiting)
        self._blamed[step] = (waiting, source)
        self._trim(self._blamed)
        return source

    def waits(self) -> list[DataWait]:
        """Every wait kept, by rank then step."""
        return sorted((w for by_rank in self._waits.values() for w in by_rank.values()),
                      key=lambda w: (w.rank, w.step))

    def by_source(self) -> dict[str, float]:
        """Total exposed wait blamed on each source (largest first); short waits are left out."""
        totals: dict[str, float] = {}
        for w in self.waits():
            if w.source:
                totals[w.source] = totals.get(w.source, 0.0) + w.wait_s
        return dict(sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])))

    def by_rank(self) -> dict[int, float]:
        """Total exposed wait of each rank (the kept steps)."""
        totals: dict[int, float] = {}
        for w in self.waits():
            totals[w.rank] = totals.get(w.rank, 0.0) + w.wait_s
        return dict(sorted(totals.items()))

    def _trim(self, table: dict) -> None:
        """Keep the ``keep_steps`` steps of ``table`` seen last."""
        while len(table) > self.keep_steps:
            del table[next(iter(table))]
