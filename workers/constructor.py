"""Data constructors: build the batches of DP groups for one step and serve them to trainer ranks.

A construct task runs on a constructor worker and builds the batches of a *part* of a step's DP
groups (one part per constructor slot). It pulls exactly the rows each group needs from the
loader workers that hold them (worker to worker, once per DP group, never once per TP/CP/PP rank),
packs them into micro-batches and keeps the finished ``DPBatch`` of each group in worker memory. Trainer ranks
then pull their own slice (CP split, metadata only for middle pipeline stages) through
:func:`make_get_batch_handler`, directly from this worker: bulk data never crosses the scheduler.

Where this runs and how a step flows through it: docs/dev/architecture.md.
"""

from __future__ import annotations

import time
from typing import Any

from mdata.batch import DPBatch, build_dp_batch
from mdata.errors import MdataError
from mdata.sources.outage_deadline import OutageDeadline
from mdata.wire.errors import InvalidRequestError
from mdata.wire.one_comm import OverComm
from mdata.wire.messages import (
    ChunkPull, ConstructPart, ConstructSpec, GetBatchReply, GetBatchRequest, NoHandlerError, Status,
    StatusRequest, TakeRowsManyRequest, TakeRowsRequest, WhoHasRequest, ask,
)
from workers.loader import as_key

PULL_ATTEMPT_S = 10.0  # one attempt to pull a chunk's rows from one loader
# Dask's connect retries a refused connection until its timeout: while a connection is not made
# within this, the scheduler is asked whether the loader still holds the chunk (see _reach).
CONNECT_CHECK_S = 0.1
# While a chunk is missing, the Planner is asked this often whether the job's sources wait on storage
# (then the chunk wait does not run out: the loaders' retry deadline bounds the wait instead).
STORAGE_CHECK_S = 1.0


class ChunkUnavailableError(MdataError):
    """A chunk a batch needs is in no worker's memory within the wait limit."""


class ChunkReleasedError(ChunkUnavailableError):
    """The chunk was released by its job (closed, or the step no longer wanted): stop waiting."""


async def _who_has(worker, keys: list) -> list[list[str] | None]:
    """Where each chunk lives now, according to the scheduler (one round trip for all keys);
    ``None`` for a chunk the scheduler has forgotten."""
    reply = await ask(worker.scheduler, WhoHasRequest(tuple(keys)))
    return [None if addresses is None else list(addresses) for addresses in reply.who_has]


async def _pull_rows(worker, key, indices, addresses: list[str], deadline: OutageDeadline):
    """Fetch rows of one chunk from whichever worker holds it; follow the chunk if it moved.

    A loader that died leaves its address behind; connecting to it would block for Dask's whole
    connect timeout, so each attempt is bounded and the scheduler is asked again on failure.
    While the job's sources wait on storage the chunk may be on its way back: ``deadline`` then waits on.
    """
    import asyncio

    delay = 0.05
    while True:
        for address in addresses:
            try:
                comm = await _reach(worker, key, address)
                if comm is None:
                    continue  # it left: ask the scheduler where the chunk is now
                reply = await _over(worker, address, comm, TakeRowsRequest(key, tuple(indices)))
            except (OSError, asyncio.TimeoutError):
                continue  # that worker is gone or stuck; ask the scheduler where the chunk is now
            except NoHandlerError:
                continue  # a worker that is shutting down has dropped its handlers
            # anything else (missing) means: ask the scheduler where the chunk lives now
            if reply.status is Status.OK:
                return reply.chunk
        now = time.monotonic()
        if deadline.check_due(now):
            deadline.observe(now, await _waits_on_storage(worker, key))
        if deadline.expired(now):
            raise ChunkUnavailableError(
                f"chunk {key} is held by no live worker (last tried {addresses}); the loader pool "
                "may have lost its workers: check the dashboard's sources page"
            )
        await asyncio.sleep(delay)
        # a lost chunk is reloaded within a step's time (by a standby): notice it that soon too
        delay = min(delay * 2, 0.25)
        addresses = _known((await _who_has(worker, [key]))[0], key)


async def _reach(worker, key, address: str):
    """A connection to the loader at ``address`` (from the worker's pool: :func:`_over` hands
    it back), or None as soon as the scheduler no longer lists it as a holder of ``key``.

    A killed loader's address refuses connections, and Dask retries those until its connect
    timeout; the scheduler knows within milliseconds that the worker left. A live loader answers
    well within ``CONNECT_CHECK_S``, so the scheduler is only asked about slow or dead ones."""
    import asyncio

    connecting = asyncio.ensure_future(worker.rpc.connect(address, timeout=PULL_ATTEMPT_S))
    try:
        while True:
            done, _ = await asyncio.wait({connecting}, timeout=CONNECT_CHECK_S)
            if done:
                return connecting.result()
            holders = (await _who_has(worker, [key]))[0]
            if holders is None or address not in holders:
                return None
    except (OSError, asyncio.TimeoutError):
        return None
    finally:
        if not connecting.done():
            connecting.cancel()


async def _over(worker, address: str, comm, request):
    """``request``'s reply over ``comm`` (from :func:`_reach`), within ``PULL_ATTEMPT_S``; the
    comm goes back to the pool after. Never through a pooled call: one that found this comm
    closed (the loader died since the connect) would reconnect for Dask's whole connect timeout."""
    import asyncio

    try:
        return await asyncio.wait_for(ask(OverComm(comm, address), request), timeout=PULL_ATTEMPT_S)
    except BaseException:
        comm.abort()  # a cancelled or failed call leaves the comm unusable
        raise
    finally:
        worker.rpc.reuse(address, comm)  # dropped there when closed


async def _pull_grouped(worker, keys: list, pulls: tuple[ChunkPull, ...]) -> list:
    """First attempt: one request per loader the Planner named, for all the chunks it holds.

    A batch draws on about a dozen chunks from a few loaders; one round trip per loader instead
    of per chunk is most of what a loader spends serving constructors. Returns each chunk's rows,
    or None for a chunk this attempt did not get (its loader died, moved it, or is an older
    worker without the handler): :func:`_pull_rows` then follows that chunk on its own."""
    import asyncio

    groups: dict[str, list[int]] = {}
    for i, pull in enumerate(pulls):
        if pull.who_has:
            groups.setdefault(pull.who_has[0], []).append(i)
    pieces: list = [None] * len(pulls)

    async def one(address: str, members: list[int]) -> None:
        request = TakeRowsManyRequest(tuple(TakeRowsRequest(keys[i], tuple(pulls[i].indices))
                                            for i in members))
        try:
            comm = await _reach(worker, keys[members[0]], address)
            if comm is None:
                return
            reply = await _over(worker, address, comm, request)
        except (OSError, asyncio.TimeoutError, NoHandlerError):
            return  # gone, stuck or shutting down: each chunk is followed on its own
        for i, answer in zip(members, reply.replies):
            if answer.status is Status.OK:
                pieces[i] = answer.chunk

    await asyncio.gather(*(one(address, members) for address, members in groups.items()))
    return pieces


async def _waits_on_storage(worker, key) -> bool:
    """Whether the Planner reports any source of the job of chunk ``key`` (``("mdata-load", job,
    source, ...)``) waiting on storage; no answer counts as no.

    Any source, not only the chunk's own: a loader works through its tasks in turn, so the load
    that would bring the chunk back can sit behind a load of another source of the same pool that
    is retrying against unreachable storage (the trainers' wait asks the same question)."""
    import asyncio

    try:
        status = await asyncio.wait_for(
            ask(worker.scheduler, StatusRequest(str(key[1]), max_steps=0)), timeout=PULL_ATTEMPT_S)
    except Exception:  # noqa: BLE001 - a job gone or a scheduler busy: the chunk wait runs on
        return False
    return bool(status.storage_waits)


def _known(addresses: list[str] | None, key) -> list[str]:
    if addresses is None:
        raise ChunkReleasedError(f"chunk {key} was released by its job; this batch is no longer wanted")
    return addresses


async def _pulled(worker, spec: ConstructSpec, deadline: OutageDeadline) -> list:
    """The rows of every chunk ``spec``'s batch draws on, in the spec's order."""
    import asyncio

    keys = [as_key(pull.key) for pull in spec.chunks]
    pieces = await _pull_grouped(worker, keys, spec.chunks)
    missing = [i for i, piece in enumerate(pieces) if piece is None]
    if missing:
        # The Planner's who_has is from submission time; a loader may have died since.
        # Nobody holding it now means it is being loaded again: wait for it, not for the
        # dead address.
        current = await _who_has(worker, [keys[i] for i in missing])
        found = await asyncio.gather(*(
            _pull_rows(worker, keys[i], list(spec.chunks[i].indices), _known(where, keys[i]),
                       deadline)
            for i, where in zip(missing, current)
        ))
        for i, piece in zip(missing, found):
            pieces[i] = piece
    return pieces


def _built(spec: ConstructSpec, pieces: list) -> DPBatch:
    return build_dp_batch(
        spec.step,
        spec.dp_rank,
        pieces,
        spec.micro_batch,
        spec.position,
        spec.lengths,
        spec.sample_ids,
        spec.num_micro_batches,
        max_tokens=spec.max_tokens,
        cp=spec.cp,
        pad_id=spec.pad_id,
        image_token_id=spec.image_token_id,
    )


def _name_group(exc: BaseException, spec: ConstructSpec) -> None:
    """Note on ``exc`` the group it failed for (a part builds several): the note travels with
    the exception to the scheduler and the trainers, its type and fields unchanged."""
    exc.add_note(f"while building the batch of step {spec.step} for DP rank {spec.dp_rank}")


def construct_part_task(msg: dict[str, Any]) -> dict[int, DPBatch]:
    """Dask task body: assemble the batches of several DP groups of one step (a *part*) from
    rows held by loaders; the result maps each group's DP rank to its ``DPBatch``.

    ``msg`` is a :class:`~mdata.wire.messages.ConstructPart` as built by the Planner plugin
    (``ConstructPart.to_msg()``), read into one ``ConstructSpec`` per group: the chunks to pull
    (key, row indices, who held them), the per-sample assignment columns in the order of the
    concatenated pulled rows, the plan's batch settings and how long to wait for a chunk. One task per constructor slot and step, not one
    per group, is what keeps the scheduler's work per step from growing with DP groups (each
    task costs it the same, whatever it builds). The groups' rows are pulled concurrently; the
    batches are packed one after the other (CPU work in the task's one thread). A group that
    cannot be built fails the task, with a note naming it.
    """
    from distributed import get_worker
    from distributed.utils import sync

    specs = ConstructPart.from_msg(msg).specs()
    worker = get_worker()
    wait_s = max(spec.wait_s for spec in specs)
    deadline = OutageDeadline(wait_s, time.monotonic(),
                              check_every=min(STORAGE_CHECK_S, wait_s / 4 or STORAGE_CHECK_S))

    async def pull_all() -> list:
        import asyncio

        async def one(spec: ConstructSpec) -> list:
            try:
                return await _pulled(worker, spec, deadline)
            except Exception as exc:
                _name_group(exc, spec)
                raise

        return list(await asyncio.gather(*(one(spec) for spec in specs)))

    pulled = sync(worker.loop, pull_all)
    out: dict[int, DPBatch] = {}
    for spec, pieces in zip(specs, pulled):
        try:
            out[spec.dp_rank] = _built(spec, pieces)
        except Exception as exc:
            _name_group(exc, spec)
            raise
    return out


def make_get_batch_handler(worker):
    """Build the function behind ``mdata_get_batch``: one trainer rank's slice of a finished batch
    (``cp_rank=None``: the whole sequence, for the receiver under ``broadcast_at("cp")``; register
    it with :func:`mdata.wire.messages.serve`)."""

    def get_batch(req: GetBatchRequest) -> GetBatchReply:
        try:
            dp_batch = worker.data[req.key]
        except KeyError:
            return GetBatchReply(Status.MISSING, req.key)
        if isinstance(dp_batch, dict) and req.dp_rank is not None:  # a part: one of its groups
            dp_batch = dp_batch.get(req.dp_rank)
            if dp_batch is None:
                raise InvalidRequestError(
                    f"mdata_get_batch: {req.key!r} holds no batch of DP rank {req.dp_rank}")
        if not isinstance(dp_batch, DPBatch):
            raise InvalidRequestError(f"mdata_get_batch: {req.key!r} is not a built batch")
        batch = dp_batch.for_rank(
            req.cp_rank, receives_tokens=req.receives_tokens, receives_labels=req.receives_labels
        )
        return GetBatchReply(Status.OK, req.key, batch)

    return get_batch
