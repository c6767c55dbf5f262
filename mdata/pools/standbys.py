"""Warm standby loaders: which worker plays which role in each pool, and who steps in on a loss (pure).

A loader pool may keep *standby* workers besides its loaders. A standby carries the resources
``standby_<source>=N`` instead of ``pool_<source>=N``, so it takes no load task, but it holds the
pool's sources open (listings, Parquet footers, readers, tokenizer) in its process. When a loader
of the pool is lost, a standby is *promoted*: it trades its ``standby_*`` resources for the
``pool_*`` ones, and the chunks Dask recomputes for the dead loader land on a warm process instead
of waiting for the restarted one's cold start.

The restarted (or any next) loader of that pool then *pays the debt*: it is demoted to standby
and warms up while it waits. The pool keeps the shape it was deployed with (loaders and standbys),
only the workers swapped roles. Rebalancing the other way (keeping the promoted standby as an extra
loader and the restarted worker too) would silently grow the pool and leave it without a standby
for the next fault.

:class:`StandbyBook` makes these decisions from what the scheduler sees (a worker joined with these
resources, a worker left) and answers with :class:`RoleChange` and :class:`Warm`. It never talks to
Dask: ``scheduler_plugins/standbys.py`` applies the answers. See docs/dev/architecture.md.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "POOL_PREFIX", "STANDBY_PREFIX", "Role", "RoleChange", "Warm", "StandbyBook", "role_of",
    "pool_resource", "standby_resource",
]

POOL_PREFIX = "pool_"
STANDBY_PREFIX = "standby_"


def pool_resource(source: str) -> str:
    """The resource of a loader of ``source`` (its load tasks need one unit of it)."""
    return f"{POOL_PREFIX}{source}"


def standby_resource(source: str) -> str:
    """The resource of a warm standby of ``source``'s pool (no task needs it: it marks the role)."""
    return f"{STANDBY_PREFIX}{source}"


class Role(str, enum.Enum):
    LOADER = "loader"
    STANDBY = "standby"

    def __str__(self) -> str:
        return self.value


def role_of(resources: Mapping[str, float]) -> tuple[Role, dict[str, float]] | None:
    """The role a worker's resources give it and the sources it serves with their amounts.

    ``pool_*`` makes a loader (a worker that somehow carries both kinds loads: its load tasks
    already run there); ``standby_*`` alone a standby; neither (a constructor): None.
    """
    loads = {r[len(POOL_PREFIX):]: float(a) for r, a in resources.items()
             if r.startswith(POOL_PREFIX) and a > 0}
    if loads:
        return Role.LOADER, loads
    stands = {r[len(STANDBY_PREFIX):]: float(a) for r, a in resources.items()
              if r.startswith(STANDBY_PREFIX) and a > 0}
    if stands:
        return Role.STANDBY, stands
    return None


@dataclass(frozen=True)
class RoleChange:
    """Give ``address`` the ``role`` for these sources: ``resources`` are its new mdata resources,
    ``drop`` the ones it loses (the other role's). ``replaces``: the lost loader it stands in for."""

    address: str
    role: Role
    resources: Mapping[str, float]
    drop: tuple[str, ...]
    replaces: str | None = None


@dataclass(frozen=True)
class Warm:
    """Open these sources (listing, footers, readers, transform) in ``address``'s process."""

    address: str
    sources: tuple[str, ...]


@dataclass
class _Worker:
    address: str
    role: Role
    amounts: dict[str, float]
    seq: int  # order of arrival: among equal standbys, the longest-waiting one is promoted
    warm: set[str] = field(default_factory=set)

    @property
    def sources(self) -> frozenset[str]:
        return frozenset(self.amounts)


class StandbyBook:
    """The loaders and standbys of every pool, and the decisions on joins and losses.

    A *pool* here is the set of sources a worker serves (what its resources say), so the same book
    works for the embedded cluster's ``PoolSpec`` and for hand-started ``dask worker`` processes.
    """

    def __init__(self) -> None:
        self._workers: dict[str, _Worker] = {}
        self._owed: Counter[frozenset[str]] = Counter()  # standbys promoted, not yet replaced
        self._served: set[str] = set()  # sources that have had a loader (the pool exists)
        # standby address -> (the sources it stands in for, the pool whose debt the promotion
        # made, the lost loader's address): promotions not confirmed yet
        self._promoting: dict[str, tuple[frozenset[str], frozenset[str], str | None]] = {}
        self._seq = 0

    # -- what the scheduler saw ------------------------------------------------------------------
    def added(self, address: str, resources: Mapping[str, float]) -> list[RoleChange | Warm]:
        """A worker joined with these resources; what to do with it.

        A loader joining a pool that owes a standby (one was promoted when a loader died) becomes
        the standby, unless it is the only loader of one of its sources. A standby joining a pool
        that has lost every loader of one of its sources becomes its loader. Any other worker keeps
        the role it asked for; a standby is warmed."""
        self._workers.pop(address, None)  # a re-registration starts afresh
        parsed = role_of(resources)
        if parsed is None:
            return []
        role, amounts = parsed
        self._seq += 1
        worker = _Worker(address, role, dict(amounts), self._seq)
        self._workers[address] = worker
        if role is Role.LOADER:
            owed = self._debt_paid_by(worker.sources)
            if owed is not None and all(self._loaders_of(s, but=address) for s in worker.sources):
                self._owed[owed] -= 1
                return [self._set_role(worker, Role.STANDBY), Warm(address, tuple(sorted(worker.sources)))]
            self._served |= worker.sources
            return []
        owed = self._debt_paid_by(worker.sources)
        if owed is not None:
            self._owed[owed] -= 1  # a standby came back: the pool's shape is whole again
        orphaned = [s for s in worker.sources if s in self._served and not self._loaders_of(s)]
        if orphaned:
            self._owed[worker.sources] += 1  # the next loader to join becomes the standby
            return [self._promote(worker, frozenset(orphaned), None, debt=worker.sources)]
        return [Warm(address, tuple(sorted(worker.sources)))]

    def removed(self, address: str, *, expected: bool = False) -> list[RoleChange]:
        """A worker left. A lost loader is replaced by the best standby of its pool: one serving
        all of its sources (the fewest others, the most already warm, the longest waiting).
        ``expected``: the scheduler retired it on purpose (a pool scaled down): no replacement."""
        if address in self._promoting:  # it died being promoted: as if the promotion failed
            out = self.promotion_failed(address)
            self._workers.pop(address, None)
            return out
        worker = self._workers.pop(address, None)
        if worker is None or worker.role is Role.STANDBY or expected:
            return []
        lost = worker.sources
        best = self._best_standby(lost)
        if best is None:
            return []
        self._owed[lost] += 1
        return [self._promote(best, lost, address)]

    def promoted(self, address: str) -> None:
        """The standby ``address`` confirmed its promotion (worker and scheduler both changed)."""
        self._promoting.pop(address, None)

    def promotion_failed(self, address: str) -> list[RoleChange]:
        """Promoting ``address`` failed (it did not answer, refused, or left): it is a standby
        again, and the lost loader's pool gets a loader another way.

        The book marked it loader when it decided, so a loader that joined meanwhile may have
        been demoted to pay the pool's debt: then that standby is promoted back (the debt was
        paid by mistake); otherwise the debt is cancelled, and the next best standby, if any,
        is promoted in its place. With none, the lost loader's restart stays a loader."""
        pending = self._promoting.pop(address, None)
        if pending is None:
            return []
        lost, debt, replaces = pending
        worker = self._workers.get(address)
        if worker is not None and worker.role is Role.LOADER:
            worker.role = Role.STANDBY  # the scheduler never gave it the pool's resources
        owed = self._owed[debt] > 0
        if owed:
            self._owed[debt] -= 1
        if all(self._loaders_of(s) for s in lost):
            return []  # the pool has a loader of every lost source anyway
        best = self._best_standby(lost, but=address)
        if best is None:
            return []
        if owed:
            self._owed[debt] += 1  # another standby steps in: the pool owes one again
        return [self._promote(best, lost, replaces, debt=debt)]

    def warmed(self, address: str, sources: Iterable[str]) -> None:
        """These sources are open in the standby ``address`` (its warm task finished)."""
        worker = self._workers.get(address)
        if worker is not None:
            worker.warm |= set(sources) & worker.sources

    def warm_for(self, sources: Iterable[str]) -> list[Warm]:
        """A job reading ``sources`` registered: warm every standby serving some of them."""
        wanted = set(sources)
        return [Warm(w.address, tuple(sorted(w.sources & wanted)))
                for w in self._workers.values()
                if w.role is Role.STANDBY and w.sources & wanted]

    # -- questions ---------------------------------------------------------------------------------
    def role(self, address: str) -> Role | None:
        """The role of the worker at ``address`` (None: not a worker of any pool)."""
        worker = self._workers.get(address)
        return None if worker is None else worker.role

    def standbys(self, source: str | None = None) -> list[str]:
        """Standby addresses (of ``source``'s pool), longest waiting first."""
        return [w.address for w in sorted(self._workers.values(), key=lambda w: w.seq)
                if w.role is Role.STANDBY and (source is None or source in w.sources)]

    def loaders(self, source: str | None = None) -> list[str]:
        """Addresses of the loaders (of ``source``'s pool, or of every pool), in order of arrival."""
        return [w.address for w in sorted(self._workers.values(), key=lambda w: w.seq)
                if w.role is Role.LOADER and (source is None or source in w.sources)]

    def snapshot(self) -> dict[str, dict]:
        """Per worker: role, sources, warm sources; and the debts per pool (for logs and tests)."""
        return {
            "workers": {w.address: {"role": w.role.value, "sources": sorted(w.sources),
                                    "warm": sorted(w.warm)}
                        for w in sorted(self._workers.values(), key=lambda w: w.seq)},
            "owed": {",".join(sorted(k)): n for k, n in self._owed.items() if n > 0},
        }

    # -- internals -----------------------------------------------------------------------------------
    def _best_standby(self, lost: frozenset[str], *, but: str | None = None) -> _Worker | None:
        """The standby to promote for a lost loader of ``lost``: one serving all of them (the
        fewest others, the most already warm, the longest waiting)."""
        candidates = [w for w in self._workers.values()
                      if w.role is Role.STANDBY and w.sources >= lost and w.address != but]
        if not candidates:
            return None
        return min(candidates, key=lambda w: (len(w.sources - lost), -len(w.warm & lost), w.seq))

    def _promote(self, worker: _Worker, lost: frozenset[str], replaces: str | None, *,
                 debt: frozenset[str] | None = None) -> RoleChange:
        """Mark ``worker`` loader of ``lost`` now, unconfirmed until :meth:`promoted`; ``debt``:
        the pool whose debt the promotion made (default: ``lost``)."""
        self._promoting[worker.address] = (lost, lost if debt is None else debt, replaces)
        return self._set_role(worker, Role.LOADER, replaces=replaces)

    def _loaders_of(self, source: str, *, but: str | None = None) -> list[str]:
        return [w.address for w in self._workers.values()
                if w.role is Role.LOADER and source in w.sources and w.address != but]

    def _debt_paid_by(self, sources: frozenset[str]) -> frozenset[str] | None:
        """A debt this worker can pay: a pool that owes a standby and whose sources it serves
        (the exact pool first)."""
        if self._owed[sources] > 0:
            return sources
        covered = [k for k, n in self._owed.items() if n > 0 and k <= sources]
        return min(covered, key=lambda k: (len(sources - k), sorted(k))) if covered else None

    def _set_role(self, worker: _Worker, role: Role, *, replaces: str | None = None) -> RoleChange:
        worker.role = role
        make, other = (pool_resource, standby_resource) if role is Role.LOADER else (
            standby_resource, pool_resource)
        if role is Role.LOADER:
            self._served |= worker.sources
        return RoleChange(
            address=worker.address, role=role,
            resources={make(s): a for s, a in sorted(worker.amounts.items())},
            drop=tuple(other(s) for s in sorted(worker.amounts)),
            replaces=replaces,
        )
