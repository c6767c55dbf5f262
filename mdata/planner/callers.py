"""Who may change a job: its drivers (the clients that registered it) and its Loaders.

Every Planner handler is reachable by anyone who reaches the scheduler's port
(docs/deploying.md). Questions about a job (status, lineage, stories) are harmless; closing it is
not: a notebook that only looked at a job, or a second script started by mistake under the same
job name, would free every chunk and batch of a run that is training. So a job-changing request
names its caller (the Dask client id) and the Planner checks it against the job's callers:

- a **driver** is a client that registered the job (``submit_job``, ``JobHandle.submit``, a
  ``Loader`` given ``plan=``); registering again with the same plan is idempotent, so whoever
  holds the plan can become a driver (that is how a restarted driver script closes its job);
- a **Loader** is a client that holds one of the job's ranks now (its lease, mdata.planner.roster).

This is bookkeeping against confusion, not authentication: Dask's own port lets any client run
code on the cluster, and only TLS keeps strangers out (docs/deploying.md). Pure: the runtime
passes the roster's holders in.
"""

from __future__ import annotations

from collections.abc import Iterable

from mdata.errors import CallerRefusedError

__all__ = ["JobCallers", "CallerRefusedError"]


class JobCallers:
    """The drivers of every job, by job name (see the module docstring)."""

    def __init__(self) -> None:
        self._drivers: dict[str, set[str]] = {}

    def registered(self, job: str, client: str) -> None:
        """``client`` registered ``job`` (first or again): it is one of the job's drivers."""
        if client:
            self._drivers.setdefault(job, set()).add(client)

    def drivers(self, job: str) -> frozenset[str]:
        return frozenset(self._drivers.get(job, ()))

    def forget(self, job: str) -> None:
        """The job closed: a job registered later under its name has drivers of its own."""
        self._drivers.pop(job, None)

    def check(self, handler: str, job: str, client: str, loaders: Iterable[str]) -> None:
        """Raise :class:`CallerRefusedError` unless ``client`` is a driver of ``job`` or one of
        ``loaders`` (the clients holding its ranks now)."""
        if not client:
            raise CallerRefusedError(
                f"{handler}: job {job!r}: the request names no client; a job is changed only by "
                "its driver or one of its Loaders, named by their Dask client id "
                "(JobHandle(client, job).close() sends it)")
        if client in self._drivers.get(job, ()) or client in set(loaders):
            return
        raise CallerRefusedError(
            f"{handler}: job {job!r} was not registered by client {client!r}, and that client "
            f"holds none of its ranks; only the job's driver or one of its Loaders may change "
            f"it. To take over a job, register it again with the same plan "
            f"(submit_job(client, plan, job={job!r}) is idempotent), then close it")
