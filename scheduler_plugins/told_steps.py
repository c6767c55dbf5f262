"""Which steps each rank's Loader told consumed, so a repeated tell counts once.

Consumption may now arrive twice: a tell sent over the client's stream whose confirmation was
lost, or whose stream was replaced (a reconnect), is sent again (:mod:`mdata.wire.stream_tells`).
The pure Planner already takes a repeat as a no-op (a rank is in its group's consumed set once,
a retired step is a late duplicate, the lineage records only new consumptions), but the
runtime's counters are sums: the rank's steps consumed (``TrainerMeter.consumed``) and its
prefetcher's waits for pushed locations. They add a step only the first time its rank's Loader
(its lease token) tells it.

Per rank the set keeps at least the newest :data:`KEEP` steps (at most twice that: it is cut back
to the newest ``KEEP`` at once when it doubles, so a tell costs O(1) amortised, not a scan of the
set each step once a long run has filled it); a step older than all of them counts as a repeat. A first tell that late (it would have to trail the rank by that many steps) is still
given to the Planner; only the counters would miss it.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["KEEP", "ToldSteps"]

#: Steps remembered per rank (a resend follows its first send within a reply timeout).
KEEP = 1024


class ToldSteps:
    """Per rank: the lease token of the Loader that told, its newest told steps, and the floor
    below which every step counts as told (see the module docstring)."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = int(keep)
        self._by_rank: dict[int, tuple[str, set[int], list[int]]] = {}  # rank -> token, steps, [floor]
        self.repeats = 0  # tells of a step its rank had told already

    def first(self, rank: int, step: int, token: str) -> bool:
        """Whether ``rank`` (lease ``token``) tells ``step`` for the first time; remembers it."""
        told = self._by_rank.get(rank)
        if told is None or told[0] != token:  # another Loader holds the rank now: it starts anew
            told = self._by_rank[rank] = (token, set(), [-1])
        _, steps, floor = told
        if step < floor[0] or step in steps:
            self.repeats += 1
            return False
        steps.add(step)
        if len(steps) > 2 * self.keep:
            newest = sorted(steps)[-self.keep:]
            steps.intersection_update(newest)
            floor[0] = newest[0]
        return True

    def first_many(self, step: int, ranks: Sequence[int], tokens: Sequence[str]) -> list[bool]:
        """:meth:`first` of ``step`` for each of ``ranks`` with its lease token."""
        first = self.first
        return [first(rank, step, token) for rank, token in zip(ranks, tokens)]

    def clear(self) -> None:
        """The job rewound: its steps will be consumed (and told) again."""
        self._by_rank.clear()
