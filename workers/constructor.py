"""Data constructors: build the batch of one DP group for one step and serve it to trainer ranks.

A construct task runs on a constructor worker. It pulls exactly the rows its DP group needs from the
loader workers that hold them (worker to worker, once per DP group, never once per TP/CP/PP rank),
packs them into micro-batches and keeps the finished ``DPBatch`` in worker memory. Trainer ranks
then pull their own slice (CP split, metadata only for middle pipeline stages) through
:func:`make_get_batch_handler`, directly from this worker: bulk data never crosses the scheduler.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mdata.batch import DPBatch, build_dp_batch
from mdata.errors import MdataError
from workers.loader import HANDLER_TAKE_ROWS, as_key

HANDLER_GET_BATCH = "mdata_get_batch"
SCHEDULER_WHO_HAS = "mdata_who_has"
PULL_ATTEMPT_S = 10.0  # one attempt to pull a chunk's rows from one loader


class ChunkUnavailableError(MdataError):
    """A chunk a batch needs is in no worker's memory within the wait limit."""


class ChunkReleasedError(ChunkUnavailableError):
    """The chunk was released by its job (closed, or the step no longer wanted): stop waiting."""


async def _who_has(worker, keys: list) -> list[list[str] | None]:
    """Where each chunk lives now, according to the scheduler (one round trip for all keys);
    ``None`` for a chunk the scheduler has forgotten."""
    reply = await getattr(worker.scheduler, SCHEDULER_WHO_HAS)(keys=[list(k) for k in keys])
    return [None if addresses is None else list(addresses) for addresses in reply["who_has"]]


async def _pull_rows(worker, key, indices, addresses: list[str], deadline: float):
    """Fetch rows of one chunk from whichever worker holds it; follow the chunk if it moved.

    A loader that died leaves its address behind; connecting to it would block for Dask's whole
    connect timeout, so each attempt is bounded and the scheduler is asked again on failure.
    """
    import asyncio

    delay = 0.05
    while True:
        for address in addresses:
            try:
                reply = await asyncio.wait_for(
                    getattr(worker.rpc(address), HANDLER_TAKE_ROWS)(key=list(key), indices=indices),
                    timeout=PULL_ATTEMPT_S,
                )
            except (OSError, asyncio.TimeoutError):
                continue  # that worker is gone or stuck; ask the scheduler where the chunk is now
            # anything else (missing, or no reply from a worker that is shutting down and has
            # dropped its handlers) means: ask the scheduler where the chunk lives now
            if isinstance(reply, dict) and reply.get("status") == "OK":
                return reply["chunk"]
        if time.monotonic() > deadline:
            raise ChunkUnavailableError(
                f"chunk {key} is held by no live worker (last tried {addresses}); the loader pool "
                "may have lost its workers: check the dashboard's sources page"
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)
        addresses = _known((await _who_has(worker, [key]))[0], key)


def _known(addresses: list[str] | None, key) -> list[str]:
    if addresses is None:
        raise ChunkReleasedError(f"chunk {key} was released by its job; this batch is no longer wanted")
    return addresses


def construct_task(spec: dict[str, Any]) -> DPBatch:
    """Dask task body: assemble one DP group's batch for one step from rows held by loaders.

    ``spec`` (built by the Planner plugin) holds ``step``, ``dp_rank``, ``chunks`` (list of
    ``(key, indices, who_has)``), and the per-sample assignment columns in the same order as the
    concatenated pulled rows: ``micro_batch``, ``position``, ``lengths``, ``sample_ids`` plus
    ``num_micro_batches``, ``max_tokens``, ``cp``, ``wait_s``.
    """
    from distributed import get_worker
    from distributed.utils import sync

    worker = get_worker()
    deadline = time.monotonic() + float(spec.get("wait_s", 120.0))

    async def pull_all():
        import asyncio

        keys = [as_key(key) for key, _, _ in spec["chunks"]]
        # The Planner's who_has is from submission time; a loader may have died since.
        current = await _who_has(worker, keys)
        return await asyncio.gather(
            *(
                _pull_rows(worker, key, list(map(int, indices)), _known(where, key) or list(hint),
                           deadline)
                for key, (_, indices, hint), where in zip(keys, spec["chunks"], current)
            )
        )

    pieces = sync(worker.loop, pull_all)
    return build_dp_batch(
        spec["step"],
        spec["dp_rank"],
        pieces,
        np.asarray(spec["micro_batch"]),
        np.asarray(spec["position"]),
        np.asarray(spec["lengths"]),
        np.asarray(spec["sample_ids"]),
        spec["num_micro_batches"],
        max_tokens=spec["max_tokens"],
        cp=spec["cp"],
        pad_id=spec.get("pad_id", 0),
        image_token_id=spec.get("image_token_id"),
    )


def make_get_batch_handler(worker):
    """Build the worker handler that serves one trainer rank its slice of a finished batch
    (``cp_rank=None``: the whole sequence, for the receiver under ``broadcast_at("cp")``)."""
    from distributed.protocol import to_serialize

    def get_batch_handler(
        key, cp_rank: int | None, receives_tokens: bool, receives_labels: bool
    ) -> dict:
        key = as_key(key)
        try:
            dp_batch = worker.data[key]
        except KeyError:
            return {"status": "missing", "key": key}
        batch = dp_batch.for_rank(
            cp_rank, receives_tokens=receives_tokens, receives_labels=receives_labels
        )
        return {"status": "OK", "batch": to_serialize(batch)}

    return get_batch_handler
