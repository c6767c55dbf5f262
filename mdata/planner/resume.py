"""What may change when a job resumes from a checkpoint, and what may not.

A checkpoint's cursors are positions in each source's order (:mod:`mdata.order`), and the order is
a function of the data alone: the sources (names, URLs, shard listings), the chunk rows, the seed
and the shuffle window. So:

- **The data must match** (:class:`~mdata.identity.DataIdentity`). Otherwise the same cursor
  names other samples, and the job would silently repeat or skip some. The refusal says what
  changed: the source, its URL before and after, the shard whose row count changed (before and
  after) or that appeared or disappeared. One change is accepted when asked for: shards
  **appended** at the end of a source's listing (``accept_appended_shards``). The known shards
  keep their order; the new ones are read after them, from the current epoch on.
- **The mixture may change when asked for** (``allow_mixture_change``): every source's cursor
  continues, so nothing is repeated, and the new weights hold exactly from the first resumed step
  (the apportioner's carries restart at zero; a metric policy's state is not carried over).
- **Placement may change freely**: the mesh (DP, CP, TP, PP), the number of micro-batches,
  ``max_tokens``, the cost model, the broadcast axis, the global batch and the number of loader
  workers. They decide where each sample goes, never which samples a step takes: with the same
  global batch every step holds the same samples as without the interruption; with another
  global batch each source's order simply continues.

A checkpoint without a data section restores under stricter rules: the light form that travels
with batches only onto the same data and mixture (it keeps their digest, and cannot say what
changed), version 1 only under the plan that wrote it (its fingerprint, as version 1 computed it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mdata.checkpoint import Checkpoint
from mdata.errors import CheckpointError, PlanError
from mdata.identity import DataIdentity, SourceData, describe, digest, listing_entries
from mdata.order import SourceOrder

__all__ = ["ResumeOptions", "Resume", "plan_resume", "schedule_description", "identity_digest",
           "legacy_fingerprint"]

_SHOWN = 5  # changed shards named in a refusal, per source


@dataclass(frozen=True)
class ResumeOptions:
    """What a resume accepts beyond an unchanged plan (see the module docstring)."""

    accept_appended_shards: bool = False
    allow_mixture_change: bool = False

    def __or__(self, other: "ResumeOptions") -> "ResumeOptions":
        return ResumeOptions(self.accept_appended_shards or other.accept_appended_shards,
                             self.allow_mixture_change or other.allow_mixture_change)


@dataclass(frozen=True)
class Resume:
    """How a checkpoint continues under a plan: each source's listing growths (those recorded in
    the checkpoint plus those this resume accepts), whether the mixture changed, and the shards
    this resume appended per source (for the log)."""

    appended: Mapping[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    mixture_changed: bool = False
    grown: Mapping[str, int] = field(default_factory=dict)


def schedule_description(plan: Any) -> Any:
    """The mixture as a checkpoint records it (its ``config()``, canonical)."""
    return describe(plan.mixture.config())


def identity_digest(data: DataIdentity, schedule: Any) -> str:
    """What a light checkpoint keeps of the job's data identity and mixture."""
    return digest([data.fingerprint(), schedule])


def legacy_fingerprint(plan: Any) -> str:
    """The fingerprint format version 1 wrote: a hash of the plan's configuration then."""
    mesh = plan.mesh
    try:
        b = plan.balance_spec
        balance: Any = [b.micro_batches, b.max_tokens, b.global_batch]
    except PlanError:
        balance = None
    config = {
        "sources": [[n, plan.chunk_rows(n)] for n in plan.source_names],
        "mixture": plan.mixture.config(),
        "cost": repr(plan.cost_model),
        "balance": balance,
        "mesh": [mesh.dp, mesh.pp, mesh.cp, mesh.tp, mesh.order],
        "broadcast": plan.broadcast,
        "seed": plan.seed_value,
        "shuffle_chunks": plan.shuffle_chunks,
        "special_tokens": [plan.pad_id, plan.image_token_id],
    }
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def plan_resume(ckpt: Checkpoint, plan: Any, listings: Mapping[str, Any],
                options: ResumeOptions = ResumeOptions()) -> Resume:
    """Check ``ckpt`` against ``plan`` and its sources' ``listings``; raise
    :class:`CheckpointError` saying what changed, or return how the job continues."""
    if ckpt.is_light:
        _check_light(ckpt, plan, listings)
        return Resume()
    if ckpt.data is None:
        _check_same_plan(ckpt, plan)
        return Resume()
    old = ckpt.data_identity
    assert old is not None
    now = DataIdentity.of(plan, listings)
    problems: list[str] = []
    appended: dict[str, tuple[tuple[int, int], ...]] = {}
    grown: dict[str, int] = {}
    if old.names != now.names:
        problems.append(_sources_changed(old.names, now.names))
    if old.seed != now.seed:
        problems.append(f"seed was {old.seed}, is now {now.seed}")
    if old.shuffle_chunks != now.shuffle_chunks:
        problems.append(f"shuffle window was {old.shuffle_chunks} chunks, is now {now.shuffle_chunks}")
    for src in now.sources:
        before = old.source(src.name)
        if before is None:
            continue  # reported with the sources above
        layout, more = _check_source(ckpt, before, src, listings[src.name], old, options, problems)
        if layout:
            appended[src.name] = layout
        if more:
            grown[src.name] = more
    if problems:
        raise CheckpointError(
            f"checkpoint at step {ckpt.step} was written by plan {ckpt.fingerprint}, not by this "
            f"plan {plan.fingerprint()}, and a checkpoint restores only onto the data it was "
            f"written for (the same cursor would name other samples): " + "; ".join(problems)
        )
    changed = _mixture_changed(ckpt, plan, options)
    return Resume(appended, changed, grown)


# -- the checks ------------------------------------------------------------------------------------
def _check_same_plan(ckpt: Checkpoint, plan: Any) -> None:
    expected = legacy_fingerprint(plan) if ckpt.version == 1 else plan.fingerprint()
    if ckpt.fingerprint != expected:
        raise CheckpointError(
            f"checkpoint at step {ckpt.step} was written by plan {ckpt.fingerprint}, not by this "
            f"plan {expected}; a checkpoint of format version {ckpt.version} without a data "
            "section restores only under the identical plan (sources, mixture, cost, batch shape, "
            "mesh, broadcast, seed and shuffle). Restore it with the plan that wrote it"
        )
    if tuple(ckpt.sources) != tuple(plan.source_names):
        raise CheckpointError(
            f"checkpoint sources {list(ckpt.sources)} differ from the plan's {list(plan.source_names)}"
        )


def _check_light(ckpt: Checkpoint, plan: Any, listings: Mapping[str, Any]) -> None:
    now = identity_digest(DataIdentity.of(plan, listings), schedule_description(plan))
    if ckpt.identity != now:
        raise CheckpointError(
            f"checkpoint at step {ckpt.step} was written by plan {ckpt.fingerprint}, not by this "
            f"plan {plan.fingerprint()}, and it is the light form that travels with batches: it "
            "keeps only a digest of its data and mixture, and this plan's data or mixture differ "
            "(or its listing grew), so it cannot say what changed nor accept any change; restore "
            "the checkpoint Loader.state_dict() or JobHandle.checkpoint() returns"
        )
    if tuple(ckpt.sources) != tuple(plan.source_names):
        raise CheckpointError(
            f"checkpoint sources {list(ckpt.sources)} differ from the plan's {list(plan.source_names)}")


def _sources_changed(old: Sequence[str], now: Sequence[str]) -> str:
    gone = [n for n in old if n not in now]
    new = [n for n in now if n not in old]
    detail = ", ".join(part for part in (f"removed {gone}" if gone else "",
                                         f"added {new}" if new else "") if part)
    return (f"sources were {list(old)}, are now {list(now)} "
            f"({detail or 'reordered: a sample id names its source by position'})")


def _check_source(ckpt: Checkpoint, before: SourceData, now: SourceData, listing: Any,
                  old: DataIdentity, options: ResumeOptions,
                  problems: list[str]) -> tuple[tuple[tuple[int, int], ...], int]:
    """Compare one source; returns its listing growths and how many shards this resume adds."""
    name = now.name
    if before.url != now.url:
        problems.append(f"source {name!r}: URL was {before.url!r}, is now {now.url!r}")
    if before.chunk_rows != now.chunk_rows:
        problems.append(f"source {name!r}: chunk rows were {before.chunk_rows}, are now "
                        f"{now.chunk_rows} (chunks are what the order permutes)")
    if before.listing is None or before.listing == now.listing:
        return before.appended, 0
    entries = listing_entries(listing)
    known = int(before.shards or 0)
    if len(entries) > known and digest([list(e) for e in entries[:known]]) == before.listing:
        added = entries[known:]
        if options.accept_appended_shards:
            epoch = _epoch_of(ckpt, before, entries[:known], old)
            return before.appended + ((epoch, known),), len(added)
        problems.append(
            f"source {name!r}: {len(added)} shards were appended after its {known} shards "
            f"({_names(added)}, {sum(r for _, r in added)} rows); pass "
            "accept_appended_shards=True to read them after the known ones, from the current "
            "epoch on"
        )
        return before.appended, 0
    problems.append(_listing_changed(name, before, entries, (ckpt.listings or {}).get(name)))
    return before.appended, 0


def _epoch_of(ckpt: Checkpoint, before: SourceData, known: Sequence[tuple[str, int]],
              old: DataIdentity) -> int:
    """The epoch the checkpoint's cursor is in, in the order the checkpoint was written under."""
    order = SourceOrder([r for _, r in known], before.chunk_rows, old.seed, before.name,
                        old.shuffle_chunks, appended=before.appended)
    return order.epoch_of(int(ckpt.cursors[before.name]))


def _listing_changed(name: str, before: SourceData, entries: Sequence[tuple[str, int]],
                     old_entries: Any) -> str:
    rows_now = sum(r for _, r in entries)
    head = (f"source {name!r}: its shards changed (the checkpoint's listing had {before.shards} "
            f"shards and {before.rows} rows, now {len(entries)} shards and {rows_now} rows)")
    if old_entries is None:
        return (f"{head}; this checkpoint carries no listing to name the shard (the one "
                "Loader.state_dict() and JobHandle.checkpoint() return does)")
    then = listing_entries(old_entries)
    changes = []
    for i, (a, b) in enumerate(zip(then, entries)):
        if a[0] != b[0]:
            changes.append(f"shard {i} was {a[0]!r} ({a[1]} rows), is now {b[0]!r} ({b[1]} rows)")
        elif a[1] != b[1]:
            changes.append(f"shard {i} {a[0]!r} had {a[1]} rows, has {b[1]} now")
    if len(then) > len(entries):
        changes.append(f"shards gone: {_names(then[len(entries):])}")
    elif len(entries) > len(then):
        changes.append(f"shards added: {_names(entries[len(then):])}")
    shown = changes[:_SHOWN] + ([f"and {len(changes) - _SHOWN} more"] if len(changes) > _SHOWN else [])
    return f"{head}: " + ", ".join(shown)


def _names(entries: Sequence[tuple[str, int]]) -> str:
    listed = ", ".join(f"{n!r} ({r} rows)" for n, r in entries[:_SHOWN])
    return listed + (f" and {len(entries) - _SHOWN} more" if len(entries) > _SHOWN else "")


def _mixture_changed(ckpt: Checkpoint, plan: Any, options: ResumeOptions) -> bool:
    if ckpt.schedule is None:
        return False
    now = schedule_description(plan)
    if describe(ckpt.schedule) == now:
        return False
    if not options.allow_mixture_change:
        raise CheckpointError(
            f"checkpoint at step {ckpt.step} was written with the mixture {_short(ckpt.schedule)}, "
            f"this plan's is {_short(now)}; pass allow_mixture_change=True to resume with the new "
            "mixture (every source's order continues where it stopped, so nothing is repeated, "
            f"and the new weights hold exactly from step {ckpt.step} on)"
        )
    return True


def _short(config: Any, limit: int = 300) -> str:
    text = json.dumps(config, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."
