"""A driver-side handle on one running job: its status, the story of a sample, its checkpoints.

The Planner answers questions through named scheduler handlers (``mdata_status``, ``mdata_story``,
``mdata_checkpoint``...). Calling them by hand means remembering handler names and argument names,
wrapping each call in ``client.sync`` and turning the tuples Dask's comms deliver back into lists.
:class:`JobHandle` does that once, with the typed messages of :mod:`mdata.wire.messages` (which
check every reply), so a notebook or a driver script reads like the questions it asks::

    job = JobHandle.submit(client, plan, job="pretrain")
    job.status()["counters"]["consumed_step"]
    print(job.story("books/2/4"))           # loaded where, planned for which rank, consumed by whom
    ckpt = job.checkpoint()                 # as of what every trainer consumed

It holds no state of its own beyond the client and the job name: everything it returns is read
from the Planner at the time of the call, so several handles (or processes) can watch one job.
This module talks to the scheduler only through those messages; it imports no Dask server code.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mdata.errors import MdataError
from mdata.lineage.ids import SampleId
from mdata.wire.messages import (
    CheckpointRequest, CloseJobRequest, JobInfoRequest, JobsRequest, JobStorageWaitsRequest,
    LineageRequest, Request, StatusRequest, StoryRequest, ask_sync,
)

__all__ = ["JobHandle", "SampleStory", "Occurrence"]


def _as_sample_id(sample_id: SampleId | str | Sequence[Any]) -> SampleId:
    if isinstance(sample_id, SampleId):
        return sample_id
    if isinstance(sample_id, str):
        try:
            return SampleId.parse(sample_id)
        except ValueError as exc:
            raise MdataError(str(exc)) from None
    try:
        source, shard, row = sample_id
        return SampleId(str(source), int(shard), int(row))
    except (TypeError, ValueError):
        raise MdataError(
            f"not a sample id: {sample_id!r}; give a SampleId, 'source/shard/row' or "
            "(source, shard, row)"
        ) from None


@dataclass(frozen=True)
class Occurrence:
    """One occurrence of a sample in a job (a sample recurs once per epoch of its source)."""

    lineage_id: int
    events: tuple[dict[str, Any], ...]

    def lines(self) -> list[str]:
        """One readable sentence per lineage event, in the order they happened."""
        out = []
        for ev in self.events:
            kind = ev.get("event")
            if kind == "loaded":
                out.append(f"loaded in chunk {ev['chunk']} on worker {ev['worker']}")
            elif kind == "planned":
                out.append(
                    f"planned for step {ev['step']}, DP rank {ev['dp_rank']}, micro-batch "
                    f"{ev['micro_batch']} at position {ev['position']} ({ev['num_tokens']} tokens, "
                    f"order position {ev['cursor']})"
                )
            elif kind == "delivered":
                out.append(f"delivered for step {ev['step']} to trainer ranks {list(ev['ranks'])}")
            elif kind == "consumed":
                out.append(f"consumed at step {ev['step']} by trainer ranks {list(ev['ranks'])}")
            else:  # events added later still show, unformatted
                out.append(", ".join(f"{k}={v}" for k, v in ev.items()))
        return out


@dataclass(frozen=True)
class SampleStory:
    """What happened to one sample in a job: one :class:`Occurrence` per time it was planned."""

    job: str
    sample_id: SampleId
    occurrences: tuple[Occurrence, ...]

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every event of every occurrence, flattened, in order."""
        return [ev for occ in self.occurrences for ev in occ.events]

    def __str__(self) -> str:
        if not self.occurrences:
            return f"{self.sample_id} has not been planned in job {self.job!r} yet"
        lines = [f"{self.sample_id} in job {self.job!r}:"]
        for occ in self.occurrences:
            lines.append(f"  occurrence {occ.lineage_id}:")
            lines.extend(f"    - {line}" for line in occ.lines())
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{occ.lineage_id}</td><td>{html.escape(line)}</td></tr>"
            for occ in self.occurrences for line in occ.lines()
        ) or "<tr><td colspan=2>not planned yet</td></tr>"
        return (f"<div><strong>story of {html.escape(str(self.sample_id))}</strong> "
                f"(job {html.escape(self.job)})<table><tr><th>occurrence</th><th>event</th></tr>"
                f"{rows}</table></div>")


class JobHandle:
    """Ask the Planner about one job of an mdata cluster (see the module docstring).

    ``client`` is a synchronous :class:`distributed.Client` connected to the cluster's scheduler.
    """

    def __init__(self, client, job: str = "default") -> None:
        if not isinstance(job, str) or not job:
            raise MdataError(f"a job name must be a non-empty string, got {job!r}")
        self.client = client
        self.job = job
        self._names: tuple[str, ...] | None = None

    @classmethod
    def submit(cls, client, plan, *, job: str = "default", checkpoint: Mapping | None = None,
               accept_appended_shards: bool = False, allow_mixture_change: bool = False) -> "JobHandle":
        """Register ``plan`` as ``job`` (idempotent for the same plan) and return its handle;
        resume options as for :func:`~mdata.driver.submit.submit_job`."""
        from mdata.driver.submit import submit_job

        submit_job(client, plan, job=job, checkpoint=None if checkpoint is None else dict(checkpoint),
                   accept_appended_shards=accept_appended_shards,
                   allow_mixture_change=allow_mixture_change)
        handle = cls(client, job)
        handle._names = tuple(plan.source_names)
        return handle

    @classmethod
    def attach(cls, client, job: str) -> "JobHandle":
        """A handle on a job someone else registered; raises MdataError if there is none."""
        jobs = cls.jobs(client)
        if job not in jobs:
            raise MdataError(
                f"no mdata job named {job!r} on the cluster at {client.scheduler.address} "
                f"(jobs: {', '.join(jobs) or 'none'}); register it with JobHandle.submit(client, plan, job=...)"
            )
        return cls(client, job)

    @staticmethod
    def jobs(client) -> list[str]:
        """Names of the jobs registered with the cluster's Planner."""
        return list(ask_sync(client, JobsRequest()).jobs)

    def _ask(self, request: Request) -> Any:
        return ask_sync(self.client, request)

    # -- questions ---------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """Fingerprint, mesh, world size and the first step trainers receive."""
        return self._ask(JobInfoRequest(self.job)).to_msg()

    def status(self, max_steps: int | None = None) -> dict[str, Any]:
        """A snapshot: per-step summaries (``steps``, keyed by step as a string; the newest
        ``max_steps`` only when given, 0: none, for a caller that polls), counters
        (planned / balanced / consumed step, chunks, truncated and skipped samples), per-rank
        consumption and wait time (``trainer_wait_s``: the prefetchers' requests;
        ``trainer_stall_s``: the training loops' own waits), pool targets, ``failure`` (None while the job is healthy) and
        ``storage_waits``: per source whose loads wait on unreachable storage right now,
        ``since`` (wall clock), ``waited_s``, ``attempts``, ``last_error``, ``workers`` and
        ``targets`` (empty while storage answers; the Planner hears it within about a second).
        ``pool_targets``: the Planner's latest :class:`~mdata.wire.pools.PoolDecision` per
        source, as dicts; ``autoscaler``: the cluster's pool autoscaler as it last reported
        (``running``, ``errors`` it survived, ``last_error``, ``workers`` per pool, ``applied``
        decisions); ``lineage``: the spilled lineage (``pending_bytes`` under ``pending_limit``,
        ``failures``, ``last_error``) and, in ``unavailable`` and ``note``, which steps' lineage
        was let go and why (docs/troubleshooting.md);
        ``recoveries``: what faults cost the job so far (``chunks_reloaded``,
        ``batches_rebuilt``, ``storage_outages``);
        ``quarantined``: per source with ``on_corrupt="skip"``, the chunks (or shards,
        at listing) passed over because they cannot be parsed: ``shard``, ``path``, ``rows``,
        ``step`` and ``reason``."""
        return self._ask(StatusRequest(self.job, max_steps=max_steps)).to_msg()

    def storage_waits(self) -> dict[str, dict[str, Any]]:
        """``status()["storage_waits"]``: the job's sources now waiting on storage, by name,
        asked alone (a status also carries a figure per rank)."""
        return self._ask(JobStorageWaitsRequest(self.job)).to_msg()["storage_waits"]

    def step_summaries(self) -> list[dict[str, Any]]:
        """The per-step summaries of :meth:`status`, as a list sorted by step."""
        steps = self.status()["steps"]
        return [steps[k] for k in sorted(steps, key=int)]

    def consumed_step(self) -> int:
        """The first step not yet consumed by every receiving rank (what a checkpoint resumes at)."""
        return int(self.status()["counters"]["consumed_step"])

    def story(self, sample_id: SampleId | str | Sequence[Any]) -> SampleStory:
        """Where one sample (``SampleId``, ``"source/shard/row"`` or a tuple) came from and went.

        A sample the job never planned has no story: :class:`~mdata.errors.SampleNotPlannedError`
        says why (no such shard or row in its source; not planned so far; its lineage let go)."""
        sid = _as_sample_id(sample_id)
        reply = self._ask(StoryRequest(self.job, sample_id=str(sid)))
        occurrences = tuple(Occurrence(o.lineage_id, tuple(o.events)) for o in reply.occurrences)
        return SampleStory(self.job, sid, occurrences)

    def checkpoint(self, step: int | None = None) -> dict[str, Any]:
        """The job's checkpoint as of having consumed every step before ``step`` (default: what
        every rank has consumed so far). Pass it to ``submit(..., checkpoint=)`` on a fresh cluster
        to replay the same samples from there."""
        if step is None:
            step = self.consumed_step()
        return self._ask(CheckpointRequest(self.job, step=int(step))).checkpoint.to_dict()

    def lineage(self, steps: int) -> dict[str, Any]:
        """Planned sample ids per step and DP rank for steps ``[0, steps)``, and the exactly-once
        report over them (``exactly_once``: ``ok``, ``samples``, ``skipped``, ``problems``)."""
        return self._ask(LineageRequest(self.job, steps=int(steps))).to_msg()

    def source_names(self) -> tuple[str, ...]:
        """The plan's source names; ``source_index`` in batches refers to this order."""
        if self._names is None:
            self._names = tuple(self.checkpoint()["sources"])
        return self._names

    def sample_ids(self, batch: Mapping[str, Any] | Any) -> list[SampleId]:
        """The readable ids of a batch's samples (a Loader item, or its ``sample_ids`` array)."""
        raw = batch["sample_ids"] if isinstance(batch, Mapping) else batch
        if hasattr(raw, "numpy"):
            raw = raw.numpy()
        ids = np.asarray(raw, dtype=np.int64).reshape(-1, 3)
        names = self.source_names()
        out = []
        for source_index, shard, row in ids.tolist():
            if not 0 <= source_index < len(names):
                raise MdataError(
                    f"job {self.job!r}: sample id ({source_index}, {shard}, {row}) names source "
                    f"index {source_index}, but the plan has {len(names)} sources {list(names)}; "
                    "was this batch from another job?"
                )
            out.append(SampleId(names[source_index], shard, row))
        return out

    def close(self) -> None:
        """Close the job on the cluster: its chunks and batches are released (idempotent).
        Only the job's driver (a client that registered it) or one of its Loaders may: a handle
        on someone else's job gets a CallerRefusedError (mdata.planner.callers)."""
        self._ask(CloseJobRequest(self.job, client=str(self.client.id)))

    def __repr__(self) -> str:
        return f"JobHandle(job={self.job!r}, scheduler={self.client.scheduler.address!r})"
