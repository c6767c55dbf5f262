"""What each trainer rank trained on, read back from its logs, and how two runs are compared.

A chaos test passes when every rank of a faulted run trained on exactly the sequence an
uninterrupted run of the same plan gives: the same sample ids and the same tokens at every step,
nothing lost, nothing repeated. The trainer process (:mod:`fault_trainer`) logs one line per batch;
this module turns the logs of a rank's successive processes into the sequence it trained on
(:func:`merge_incarnations`), compares sequences (:func:`sequence_problems`) and checks that each
step's samples are spread over the data-parallel groups exactly once (:func:`exactly_once_problems`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Received", "TrainerLog", "read_log", "merge_incarnations", "sequence_problems",
           "assert_same_sequences", "exactly_once_problems", "assert_exactly_once"]

SampleIds = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Received:
    """One batch as a rank received it: the step, its sample ids in order, a hash of its tokens."""

    step: int
    sample_ids: SampleIds
    tokens: str


@dataclass
class TrainerLog:
    """Everything one trainer process wrote: where it started, its batches, how it ended."""

    path: Path
    start_step: int | None = None
    pid: int | None = None
    batches: list[Received] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)  # next_step of each saved state
    done: bool = False
    error: str | None = None

    @property
    def last_step(self) -> int:
        """The last step logged, -1 before the first batch."""
        return self.batches[-1].step if self.batches else -1


def read_log(path: Path) -> TrainerLog:
    """Parse a trainer's JSON Lines log; a torn last line (the process was killed) is ignored."""
    log = TrainerLog(Path(path))
    if not log.path.exists():
        return log
    for line in log.path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # the line a SIGKILL cut short
        kind = rec.get("kind")
        if kind == "start":
            log.start_step, log.pid = int(rec["start_step"]), int(rec["pid"])
        elif kind == "batch":
            ids = tuple(tuple(int(x) for x in sid) for sid in rec["sample_ids"])
            log.batches.append(Received(int(rec["step"]), ids, str(rec["tokens"])))
        elif kind == "checkpoint":
            log.checkpoints.append(int(rec["next_step"]))
        elif kind == "done":
            log.done = True
        elif kind == "error":
            log.error = str(rec["error"])
    return log


def merge_incarnations(logs: list[TrainerLog]) -> list[Received]:
    """The sequence one rank *trained on*, from the logs of its successive processes.

    The rule: a process restarted from a checkpoint whose ``next_step`` is ``C`` replaces
    everything from step ``C`` on. Lines the previous process logged for steps ``>= C`` were
    received, and maybe even computed on, but the model state that saw them was never saved: the
    restart rolls the model back to the checkpoint taken before step ``C``, so those steps are
    trained again by the new process and only the new process's batches count. Lines before ``C``
    stay: the checkpoint includes what they trained.

    ``logs`` are in start order; each one's ``start_step`` is its ``C`` (0 for the first). A
    restart from a step the earlier processes never reached would leave a hole; it is not patched
    here, so the comparison reports the missing steps.
    """
    merged: list[Received] = []
    for log in logs:
        cut = 0 if log.start_step is None else log.start_step
        merged = [r for r in merged if r.step < cut] + list(log.batches)
    return merged


def _show(ids: SampleIds, limit: int = 6) -> str:
    text = ", ".join("/".join(map(str, sid)) for sid in ids[:limit])
    return f"[{text}{', ...' if len(ids) > limit else ''}] ({len(ids)} samples)"


def sequence_problems(reference: dict[int, list[Received]], got: dict[int, list[Received]],
                      *, limit: int = 12) -> list[str]:
    """Human-readable differences between two runs, per rank and step, first ones first."""
    problems: list[str] = []
    for rank in sorted(set(reference) | set(got)):
        ref, run = reference.get(rank, []), got.get(rank, [])
        ref_steps, run_steps = [r.step for r in ref], [r.step for r in run]
        if ref_steps != run_steps:
            at = next((i for i, (a, b) in enumerate(zip(ref_steps, run_steps)) if a != b),
                      min(len(ref_steps), len(run_steps)))
            repeated = sorted({s for s in run_steps if run_steps.count(s) > 1})
            missing = sorted(set(ref_steps) - set(run_steps))
            problems.append(
                f"rank {rank}: steps differ from position {at}: reference "
                f"{ref_steps[at:at + 5]}..., got {run_steps[at:at + 5]}... "
                f"(missing {missing[:10]}, repeated {repeated[:10]}, {len(run_steps)} vs "
                f"{len(ref_steps)} steps)")
        by_step = {r.step: r for r in run}
        for want in ref:
            have = by_step.get(want.step)
            if have is None:
                continue
            if have.sample_ids != want.sample_ids:
                lost = [s for s in want.sample_ids if s not in set(have.sample_ids)]
                extra = [s for s in have.sample_ids if s not in set(want.sample_ids)]
                problems.append(
                    f"rank {rank} step {want.step}: sample ids differ: reference "
                    f"{_show(want.sample_ids)}, got {_show(have.sample_ids)}; lost {_show(tuple(lost))},"
                    f" not planned {_show(tuple(extra))}")
            elif have.tokens != want.tokens:
                problems.append(f"rank {rank} step {want.step}: same sample ids, different tokens "
                                f"(sha1 {want.tokens[:12]} vs {have.tokens[:12]})")
            if len(problems) >= limit:
                return problems + ["... (more differences not shown)"]
    return problems


def assert_same_sequences(reference: dict[int, list[Received]], got: dict[int, list[Received]],
                          what: str = "the faulted run") -> None:
    """Fail, listing the first differences, unless ``got`` equals ``reference`` rank by rank."""
    problems = sequence_problems(reference, got)
    assert not problems, f"{what} differs from the uninterrupted reference:\n  " + "\n  ".join(problems)


def exactly_once_problems(sequences: dict[int, list[Received]], mesh, *, global_batch: int | None = None,
                          across_steps: bool = True) -> list[str]:
    """Each step's samples go to the DP groups exactly once: the ranks of one DP group received
    the same ids, no id twice within a group, the groups' ids disjoint, ``global_batch`` in all;
    with ``across_steps`` no sample comes back in a later step (runs shorter than an epoch)."""
    problems: list[str] = []
    steps = sorted({r.step for seq in sequences.values() for r in seq})
    by_rank = {rank: {r.step: r for r in seq} for rank, seq in sequences.items()}
    seen: dict[tuple[int, ...], int] = {}
    for step in steps:
        groups: dict[int, SampleIds] = {}
        for rank in sorted(sequences):
            rec = by_rank[rank].get(step)
            if rec is None:
                problems.append(f"step {step}: rank {rank} received nothing")
                continue
            dp = mesh.coordinate(rank).dp
            if dp in groups and groups[dp] != rec.sample_ids:
                problems.append(f"step {step}: ranks of DP group {dp} received different samples")
            groups.setdefault(dp, rec.sample_ids)
        everything = [sid for ids in groups.values() for sid in ids]
        if len(set(everything)) != len(everything):
            twice = sorted({s for s in everything if everything.count(s) > 1})
            problems.append(f"step {step}: samples delivered twice: {_show(tuple(twice))}")
        if global_batch is not None and len(set(everything)) != global_batch:
            problems.append(f"step {step}: {len(set(everything))} distinct samples, planned {global_batch}")
        if across_steps:
            for sid in set(everything):
                if sid in seen:
                    problems.append(f"step {step}: sample {'/'.join(map(str, sid))} already came in step {seen[sid]}")
                seen.setdefault(sid, step)
    return problems


def assert_exactly_once(sequences: dict[int, list[Received]], mesh, **kwargs) -> None:
    problems = exactly_once_problems(sequences, mesh, **kwargs)
    assert not problems, "samples lost or repeated:\n  " + "\n  ".join(problems[:12])
