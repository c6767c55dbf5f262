"""Trainer ranks in lock step, as a training loop's collective keeps them, for fault figures.

Both the reliability benchmarks and the fault tests need the same thing: N ranks, each with its
own :class:`~mdata.trainer.Loader` in a thread, that take a batch, spend a fixed time on a
stand-in for the training step and meet the others before the next one; a hook that runs once
between two steps while every rank waits (that is where a fault is injected); and, per rank and
step, what the rank received and how long it was blocked on the batch. A hash of the tokens
makes "received the same" mean the same bytes, not only the same sample ids.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["token_hash", "drive_in_lockstep"]


def token_hash(batch) -> str:
    """sha1 over every micro-batch's ``input_ids`` of one received batch."""
    digest = hashlib.sha1()
    for mb in batch["micro_batches"]:
        digest.update(mb["input_ids"].numpy().tobytes())
    return digest.hexdigest()


def drive_in_lockstep(client, job: str, *, steps: int, step_s: float, keep: Callable[[Any], Any],
                      between: Callable[[int], None] | None = None, ranks: int = 2,
                      timeout: float = 120.0) -> dict[int, list[tuple[Any, float]]]:
    """Run ``ranks`` Loaders of ``job`` for ``steps`` steps; ``between(n)`` runs once after the
    n-th meeting (n = 1 after step 0). Returns, per rank, ``(keep(batch), seconds blocked)`` per
    step. The last batch is acknowledged as consumed; the first failure is raised."""
    from mdata.trainer import Loader

    got: dict[int, list[tuple[Any, float]]] = {r: [] for r in range(ranks)}
    errors: list[BaseException] = []
    meetings = [0]

    def meet() -> None:  # one thread runs it while every rank waits at the barrier
        meetings[0] += 1
        if between is not None:
            between(meetings[0])

    barrier = threading.Barrier(ranks, action=meet)

    def rank_loop(rank: int) -> None:
        try:
            with Loader(client, job=job, rank=rank, world_size=ranks, timeout=timeout) as loader:
                it = iter(loader)
                for _ in range(steps):
                    began = time.perf_counter()
                    batch = next(it)
                    got[rank].append((keep(batch), time.perf_counter() - began))
                    time.sleep(step_s)  # the training step
                    barrier.wait(timeout=2 * timeout)
                loader.mark_consumed()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=rank_loop, args=(r,), name=f"rank-{r}") for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(3 * timeout)
    if errors:
        raise errors[0]
    return got
