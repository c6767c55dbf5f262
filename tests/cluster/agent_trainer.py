"""Trainer process body for the host agent's cluster tests (its own module, for ``spawn``).

Each process is one rank with a Loader given the scheduler's address (as torchrun's local ranks
are); ``agent`` turns ``mdata.trainer.host-agent`` on in it. Every step it puts
``("step", rank, step)`` on ``out`` (so a test can act mid-run), then at the end
``("done", rank, received, client id, why the agent was lost)`` or ``("error", rank, text)``.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import time

#: The signal on which a trainer writes every thread's stack to stderr: a test that hears nothing
#: from it sends this first, so a hang shows where it is (:func:`silent_trainers`).
DUMP_SIGNAL = signal.SIGUSR1


def silent_trainers(procs, last: dict) -> str:
    """After no word from the trainers: have each live one write its threads' stacks to stderr
    (before the test fails and its cluster closes), and say so with what each rank last told."""
    asked = []
    for proc in procs:
        if proc.is_alive():
            try:
                os.kill(proc.pid, DUMP_SIGNAL)
                asked.append(proc.pid)
            except ProcessLookupError:
                pass
    time.sleep(1.0)
    return (f"no word from the trainers within 180 s (stacks of pids {asked} on stderr); "
            f"last from each rank: {last}")


def trainer(rank: int, world: int, address: str, job: str, steps: int, out, agent: bool,
            step_s: float, until: bool = False) -> None:
    """``until``: ``steps`` is the step to stop before, wherever the rank starts (a restarted
    rank goes on from its first step not consumed)."""
    import dask

    from benchmarks.lockstep import token_hash
    from mdata.trainer import Loader

    faulthandler.register(DUMP_SIGNAL, all_threads=True)
    try:
        with dask.config.set({"mdata.trainer.host-agent": agent}):
            got = []
            with Loader(address, job=job, rank=rank, world_size=world, steps=steps,
                        timeout=90, device="cpu") as loader:
                if until:
                    loader.steps = steps - loader.attach()["start_step"]
                for batch in loader:
                    got.append((batch["step"], batch["sample_ids"].tolist(), token_hash(batch)))
                    out.put(("step", rank, batch["step"]))
                    time.sleep(step_s)
                client_id = str(loader.client.id)
                lost = getattr(loader.client, "lost", None)
        out.put(("done", rank, got, client_id, lost))
    except BaseException as exc:  # noqa: BLE001 - reported to the test, never a hang
        out.put(("error", rank, f"{type(exc).__name__}: {exc}"))
