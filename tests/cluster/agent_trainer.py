"""Trainer process body for the host agent's cluster tests (its own module, for ``spawn``).

Each process is one rank with a Loader given the scheduler's address (as torchrun's local ranks
are); ``agent`` turns ``mdata.trainer.host-agent`` on in it. Every step it sends
``("step", rank, step)`` on ``out`` (so a test can act mid-run; a rank fed by broadcast records
whom from and its checkpoint's step instead of samples), then at the end
``("done", rank, received, client id, why the agent was lost)`` or ``("error", rank, text)``.

``out`` is the process' own pipe (:class:`Inbox`), not a queue shared by all: the tests kill
trainers with SIGKILL, and a process killed while its queue feeder held the shared queue's write
lock left every other trainer blocked on that lock at exit, its last messages never sent. That
was the host-agent tests' intermittent "no word from the trainers for 180 s": the trainers had
finished; their results were stuck behind the dead process' lock.
"""

from __future__ import annotations

import faulthandler
import os
import queue
import signal
import time
from multiprocessing.connection import wait

#: The signal on which a trainer writes every thread's stack to stderr: a test that hears nothing
#: from it sends this first, so a hang shows where it is (:func:`silent_trainers`).
DUMP_SIGNAL = signal.SIGUSR1


class Inbox:
    """Messages from trainer processes, one pipe each (see the module docstring): ``writer(key)``
    is what a process sends on, ``get`` the next message from any of them, ``drop(key)`` forgets
    a killed process' pipe (a message it was writing may be cut short)."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self._readers: dict = {}
        self._writers: list = []

    def writer(self, key):
        reader, writer = self.ctx.Pipe(duplex=False)
        self._readers[key] = reader
        self._writers.append(writer)
        return writer

    def started(self) -> None:
        """The processes given writers have started: close this process' copies, so a pipe
        whose process ended reads as ended (EOF) instead of staying open."""
        for writer in self._writers:
            writer.close()
        self._writers.clear()

    def drop(self, key) -> None:
        reader = self._readers.pop(key, None)
        if reader is not None:
            reader.close()

    def get(self, timeout: float):
        """The next message; ``queue.Empty`` after ``timeout`` seconds without one."""
        deadline = time.monotonic() + timeout
        while self._readers:
            ready = wait(list(self._readers.values()), max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for reader in ready:
                try:
                    return reader.recv()
                except (EOFError, OSError):  # that process ended: nothing more from it
                    self._readers = {k: r for k, r in self._readers.items() if r is not reader}
                    reader.close()
        raise queue.Empty


def silent_trainers(procs, last: dict, scheduler: str = "") -> str:
    """After no word from the trainers: have each live one write its threads' stacks to stderr
    (before the test fails and its cluster closes), and the host agent of ``scheduler`` its own
    to its log, quoted here; say so with what each rank last told."""
    from mdata.trainer.agent_lock import agent_paths, read_address

    asked = [proc.pid for proc in procs if proc.is_alive()]
    agent = read_address(agent_paths(scheduler)[1]) if scheduler else None
    for pid in asked + ([agent.pid] if agent is not None else []):
        try:
            os.kill(pid, DUMP_SIGNAL)
        except ProcessLookupError:
            pass
    time.sleep(1.0)
    said = ""
    if agent is not None:
        log = agent_paths(scheduler)[0].with_suffix(".log")
        said = f"; the agent (pid {agent.pid}) logged: {log.read_text(errors='replace')[-8000:]}" \
            if log.exists() else f"; the agent (pid {agent.pid}) has no log"
    return (f"no word from the trainers within 180 s (stacks of pids {asked} on stderr); "
            f"last from each rank: {last}{said}")


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
                    if batch["micro_batches"] is None:  # fed by broadcast: whom from, and the
                        # step its state_dict() says it consumed
                        got.append((batch["step"], "broadcast from", batch["broadcast_from"],
                                    loader.state_dict()["checkpoint"]["step"]))
                    else:
                        got.append((batch["step"], batch["sample_ids"].tolist(), token_hash(batch)))
                    out.send(("step", rank, batch["step"]))
                    time.sleep(step_s)
                client_id = str(loader.client.id)
                lost = getattr(loader.client, "lost", None)
        out.send(("done", rank, got, client_id, lost))
    except BaseException as exc:  # noqa: BLE001 - reported to the test, never a hang
        out.send(("error", rank, f"{type(exc).__name__}: {exc}"))
