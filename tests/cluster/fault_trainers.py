"""Chaos harness, trainers: one :mod:`fault_trainer` process per rank, across kills and restarts.

:class:`TrainerGroup` starts the ranks of one job, kills and restarts them from their checkpoints,
waits on their progress (read from their logs) and returns what each rank trained on
(:meth:`TrainerGroup.received`, merged by :func:`fault_sequences.merge_incarnations`).
:func:`uninterrupted_run` runs a plan once without faults; :func:`reference` caches that per plan
fingerprint (which includes the sources' URLs: a local and an S3 copy of a corpus deliver the
same sequence, which the S3 tests check against the local reference, but are two plans).

Every wait is bounded and raises :class:`~fault_procs.HarnessError` with the trainers' last words.
"""

from __future__ import annotations

import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fault_procs import HERE, HarnessError, close_job, free_port, kill9, subprocess_env, tail
from fault_sequences import Received, TrainerLog, merge_incarnations, read_log

__all__ = ["Incarnation", "TrainerGroup", "uninterrupted_run", "reference"]


@dataclass
class Incarnation:
    """One process of one rank: the first, or a restart from the checkpoint of ``resumed_from``."""

    rank: int
    number: int
    proc: subprocess.Popen
    out: Path
    stderr: Path
    resumed_from: int | None

    def log(self) -> TrainerLog:
        return read_log(self.out)


class TrainerGroup:
    """The ``world_size`` trainer processes of one job, across kills and restarts.

    ``plan``: when given, every trainer passes it to its Loader, which registers the job (with the
    resume checkpoint, if any): needed to resume on a fresh cluster. ``step_sleep`` simulates
    compute so faults land mid-run; ``dist`` puts the ranks in a gloo group (see fault_trainer).
    """

    def __init__(self, workdir: Path, *, job: str, world_size: int, end_step: int, plan=None,
                 checkpoint_every: int = 4, step_sleep: float = 0.0, timeout: float = 60.0,
                 dist: bool = True) -> None:
        self.workdir = Path(workdir) / job
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.job, self.world_size, self.end_step = job, world_size, end_step
        self.checkpoint_every, self.step_sleep, self.timeout = checkpoint_every, step_sleep, timeout
        self.dist = dist and world_size > 1
        self.plan_path: Path | None = None
        if plan is not None:
            self.plan_path = self.workdir / "plan.pkl"
            self.plan_path.write_bytes(pickle.dumps(plan))
        self.incarnations: dict[int, list[Incarnation]] = {r: [] for r in range(world_size)}

    def checkpoint_dir(self, rank: int) -> Path:
        return self.workdir / "checkpoints" / f"rank{rank}"

    def current(self, rank: int) -> Incarnation:
        return self.incarnations[rank][-1]

    def start(self, address: str, *, resume_step: int | None = None) -> None:
        """Start every rank (a new gloo group); with ``resume_step``, each from its checkpoint
        ``step-<resume_step>.json``. Ranks still running must have been stopped first."""
        if any(inc.proc.poll() is None for incs in self.incarnations.values() for inc in incs):
            raise HarnessError("stop the running trainers before starting the group again")
        if resume_step is not None:
            self._forget_checkpoints_after(resume_step)
        port = free_port() if self.dist else None
        for rank in range(self.world_size):
            self._start_rank(address, rank, resume_step, port)

    def _start_rank(self, address: str, rank: int, resume_step: int | None, port: int | None) -> None:
        number = len(self.incarnations[rank])
        out = self.workdir / f"rank{rank}.{number}.jsonl"
        stderr = self.workdir / f"rank{rank}.{number}.stderr"
        cmd = [sys.executable, str(HERE / "fault_trainer.py"), "--address", address, "--job", self.job,
               "--rank", str(rank), "--world-size", str(self.world_size),
               "--end-step", str(self.end_step), "--out", str(out),
               "--checkpoint-dir", str(self.checkpoint_dir(rank)),
               "--checkpoint-every", str(self.checkpoint_every), "--step-sleep", str(self.step_sleep),
               "--timeout", str(self.timeout), "--dist-timeout", str(self.timeout)]
        if self.plan_path is not None:
            cmd += ["--plan", str(self.plan_path)]
        if resume_step is not None:
            state = self.checkpoint_dir(rank) / f"step-{resume_step:06d}.json"
            if not state.exists():
                raise HarnessError(f"rank {rank} has no checkpoint for step {resume_step}")
            cmd += ["--resume", str(state)]
        if port is not None:
            cmd += ["--dist-port", str(port)]
        with open(stderr, "wb") as err:
            proc = subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT, env=subprocess_env())
        self.incarnations[rank].append(Incarnation(rank, number, proc, out, stderr, resume_step))

    def _forget_checkpoints_after(self, step: int) -> None:
        """Training rolls back to ``step``: checkpoints past it belong to the abandoned timeline
        (some ranks may have saved one the others never reached) and must not be resumed from."""
        for rank in range(self.world_size):
            for later in (s for s in self.checkpoints(rank) if s > step):
                (self.checkpoint_dir(rank) / f"step-{later:06d}.json").unlink()

    def kill9(self, rank: int) -> None:
        """SIGKILL the rank's running process and reap it."""
        inc = self.current(rank)
        if inc.proc.poll() is None:
            kill9(inc.proc.pid)
        inc.proc.wait(timeout=30)

    def kill_all(self) -> None:
        for rank in self.incarnations:
            if self.incarnations[rank]:
                self.kill9(rank)

    close = kill_all

    def restart_from_last_common_checkpoint(self, address: str) -> int:
        """Stop every rank (SIGKILL, as a job scheduler does when one rank of a job dies) and
        start them all again from the last checkpoint every rank saved; returns its step."""
        self.kill_all()
        step = self.last_common_checkpoint()
        self.start(address, resume_step=step)
        return step

    def checkpoints(self, rank: int) -> list[int]:
        """The ``next_step`` of every complete checkpoint file of ``rank``, ascending."""
        folder = self.checkpoint_dir(rank)
        return sorted(int(p.stem.split("-")[1]) for p in folder.glob("step-*.json")) if folder.exists() else []

    def last_common_checkpoint(self) -> int:
        """The latest step every rank saved a checkpoint for (what a restart resumes from)."""
        common = set.intersection(*(set(self.checkpoints(r)) for r in range(self.world_size)))
        if not common:
            raise HarnessError(f"no checkpoint common to all ranks: {[self.checkpoints(r) for r in range(self.world_size)]}")
        return max(common)

    def _diagnosis(self) -> str:
        lines = []
        for rank, incs in self.incarnations.items():
            for inc in incs:
                log = inc.log()
                lines.append(f"rank {rank} process {inc.number} (pid {inc.proc.pid}, exit "
                             f"{inc.proc.poll()}, resumed from {inc.resumed_from}): last step "
                             f"{log.last_step}, done={log.done}, error={log.error}")
                if log.error or (inc.proc.poll() not in (None, 0, -signal.SIGKILL)):
                    lines.append("    " + tail(inc.stderr, 800).replace("\n", "\n    "))
        return "\n".join(lines)

    def wait_for_step(self, step: int, *, timeout: float = 60.0, ranks: Sequence[int] | None = None) -> None:
        """Wait until the current process of every rank (of ``ranks``) has logged ``step``."""
        ranks = list(range(self.world_size)) if ranks is None else list(ranks)
        deadline = time.monotonic() + timeout
        while True:
            behind = []
            for rank in ranks:
                inc = self.current(rank)
                log = inc.log()
                if log.last_step >= step:
                    continue
                if inc.proc.poll() is not None:
                    raise HarnessError(f"rank {rank} exited before step {step}:\n{self._diagnosis()}")
                behind.append(rank)
            if not behind:
                return
            if time.monotonic() > deadline:
                raise HarnessError(f"ranks {behind} did not reach step {step} within {timeout:.0f}s:\n"
                                   f"{self._diagnosis()}")
            time.sleep(0.05)

    def wait_until_stalled(self, *, quiet: float = 1.5, timeout: float = 30.0) -> bool:
        """Wait until no rank has logged a new step for ``quiet`` seconds (they wait for data, or
        have exited); False if every rank finished its steps first (the fault came too late)."""
        deadline = time.monotonic() + timeout
        last, since = None, time.monotonic()
        while True:
            logs = [self.current(r).log() for r in range(self.world_size)]
            if all(log.done for log in logs):
                return False
            now = tuple(log.last_step for log in logs)
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return True
            if time.monotonic() > deadline:
                raise HarnessError(f"trainers kept stepping for {timeout:.0f}s:\n{self._diagnosis()}")
            time.sleep(0.05)

    def wait_done(self, timeout: float = 120.0) -> None:
        """Wait for every rank's current process to finish its steps and exit cleanly."""
        deadline = time.monotonic() + timeout
        for rank in range(self.world_size):
            inc = self.current(rank)
            try:
                inc.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                diagnosis = self._diagnosis()
                self.kill_all()
                raise HarnessError(f"trainers still running after {timeout:.0f}s:\n{diagnosis}") from None
        failed = [r for r in range(self.world_size)
                  if self.current(r).proc.returncode != 0 or not self.current(r).log().done]
        if failed:
            raise HarnessError(f"ranks {failed} failed:\n{self._diagnosis()}")

    def received(self) -> dict[int, list[Received]]:
        """What each rank trained on, its processes merged (see ``merge_incarnations``)."""
        return {rank: merge_incarnations([inc.log() for inc in incs])
                for rank, incs in self.incarnations.items()}


# -- uninterrupted runs ------------------------------------------------------------------------------
def uninterrupted_run(address: str, plan, workdir: Path, *, job: str, end_step: int,
                      timeout: float = 120.0, **trainer_kwargs) -> dict[int, list[Received]]:
    """Run ``plan`` as a fresh ``job`` with no fault; returns what each rank received."""
    group = TrainerGroup(workdir, job=job, world_size=plan.mesh.world_size, end_step=end_step,
                         plan=plan, **trainer_kwargs)
    try:
        group.start(address)
        group.wait_done(timeout)
    finally:
        group.kill_all()
        _close_job_at(address, job, plan)
    return group.received()


def _close_job_at(address: str, job: str, plan) -> None:
    """Free a finished job's chunks and batches on the cluster (best effort: it may be gone)."""
    from distributed import Client

    try:
        with Client(address, set_as_default=False, timeout=10) as client:
            close_job(client, job, plan)
    except OSError:
        pass


_REFERENCES: dict[tuple[str, int], dict[int, list[Received]]] = {}


def reference(address: str, plan, workdir: Path, *, end_step: int) -> dict[int, list[Received]]:
    """The uninterrupted sequence of ``plan`` for ``end_step`` steps, run once per test session.

    Keyed by the plan's fingerprint, which covers everything that decides who receives what
    (and where the shards are stored)."""
    key = (plan.fingerprint(), end_step)
    if key not in _REFERENCES:
        job = f"reference-{key[0][:8]}-{end_step}"
        _REFERENCES[key] = uninterrupted_run(address, plan, workdir, job=job, end_step=end_step)
    return _REFERENCES[key]
