"""Messages of a construct task: its spec (from the Planner), where chunks live (asked of the
Planner) and the rows it pulls from loaders.

* Planner -> constructor: :class:`ConstructPart`, the argument of the construct task (several
  DP groups of a step in one set of columns), read into one :class:`ConstructSpec` per group;
* constructor -> Planner: :class:`WhoHasRequest`;
* constructor -> loader: :class:`TakeRowsRequest`, answered with a
  :class:`~mdata.sources.SampleChunk` as a ``to_serialize`` object, as it always travelled; or
  :class:`TakeRowsManyRequest`, the rows of every chunk one loader holds for a batch in one
  round trip (a batch draws on a dozen chunks and a loader's CPU went mostly to per-message
  overhead when each was a request of its own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from mdata.sources.chunk import SampleChunk
from mdata.wire.codec import (
    Handler, Message, Reader, Request, Status, check_int, check_str, held_msg, int_array, int_array_msg,
    int_tuple, key_msg, key_of, list_of, read_held,
)

__all__ = [
    "WhoHasRequest", "WhoHasReply", "TakeRowsRequest", "TakeRowsReply", "TakeRowsManyRequest",
    "TakeRowsManyReply", "ChunkPull", "ConstructSpec", "ConstructPart",
]


# -- Planner -> constructor ----------------------------------------------------------------------
@dataclass(frozen=True)
class ChunkPull(Message):
    """Rows ``indices`` of the chunk under ``key``, held (when the step was planned) by ``who_has``."""

    key: tuple
    indices: tuple[int, ...]
    who_has: tuple[str, ...]

    def to_msg(self) -> list:
        return [key_msg(self.key), list(self.indices), list(self.who_has)]

    @classmethod
    def read(cls, value: Any, r: Reader, name: str) -> "ChunkPull":
        if not isinstance(value, (list, tuple)) or len(value) != 3:
            raise r.fail(name, f"must be [key, indices, who_has], got {value!r:.80}")
        key, indices, who_has = value
        return cls(key_of(key, r, name), int_tuple(indices, r, f"{name} indices"),
                   list_of(check_str)(who_has, r, f"{name} who_has"))


class _ColumnsEqual:
    """Equality of a message with numpy columns (``_ARRAYS``): field by field, arrays by value."""

    _ARRAYS: tuple[str, ...] = ()

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(
            np.array_equal(getattr(self, f), getattr(other, f)) if f in self._ARRAYS
            else getattr(self, f) == getattr(other, f)
            for f in self.__dataclass_fields__  # type: ignore[attr-defined]
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, eq=False, kw_only=True)
class _BatchSettings:
    """The plan's batch settings every construct message carries, each required, by keyword."""

    FIELDS: ClassVar[tuple[str, ...]] = (
        "num_micro_batches", "max_tokens", "cp", "pad_id", "image_token_id", "wait_s")

    num_micro_batches: int
    max_tokens: int
    cp: int
    pad_id: int
    image_token_id: int | None
    wait_s: float


@dataclass(frozen=True, eq=False)
class ConstructSpec(_ColumnsEqual, _BatchSettings, Message):
    """Everything a construct task needs to build the batch of one DP group for one step.

    ``chunks`` are pulled in order and their rows concatenated; the per-sample columns
    (``micro_batch``, ``position``, ``lengths``, ``sample_ids`` as ``[source_index, shard, row]``)
    follow that order. ``max_tokens``, ``cp``, ``pad_id`` and ``image_token_id`` come from the
    plan; ``wait_s`` is how long to wait for a chunk (``constructor.chunk-wait``). Every field is
    required: the Planner's configuration is the one source of these values. On the wire (a
    Dask task argument) the columns stay numpy arrays.
    """

    step: int
    dp_rank: int
    chunks: tuple[ChunkPull, ...]
    micro_batch: np.ndarray
    position: np.ndarray
    lengths: np.ndarray
    sample_ids: np.ndarray

    _ARRAYS = ("micro_batch", "position", "lengths", "sample_ids")

    def to_msg(self) -> dict[str, Any]:
        return {
            "step": self.step, "dp_rank": self.dp_rank, "chunks": [c.to_msg() for c in self.chunks],
            "micro_batch": int_array_msg(self.micro_batch), "position": int_array_msg(self.position),
            "lengths": int_array_msg(self.lengths), "sample_ids": int_array_msg(self.sample_ids),
            "num_micro_batches": self.num_micro_batches,
            "max_tokens": self.max_tokens, "cp": self.cp, "pad_id": self.pad_id,
            "image_token_id": self.image_token_id, "wait_s": self.wait_s,
        }

    @classmethod
    def from_msg(cls, msg: Any) -> "ConstructSpec":
        r = Reader(cls.__name__, msg)
        chunks = r.list("chunks", ChunkPull.read)
        columns = {f: int_array(r.raw(f), r, f, ndim=2 if f == "sample_ids" else 1)
                   for f in cls._ARRAYS}
        _check_samples(r, columns, sum(len(c.indices) for c in chunks), "chunks")
        out = cls(step=r.int("step"), dp_rank=r.int("dp_rank"), chunks=chunks, **columns,
                  **_read_settings(r))
        r.done()
        return out


def _read_settings(r: Reader) -> dict[str, Any]:
    """A construct message's batch settings (every one required)."""
    return dict(num_micro_batches=r.int("num_micro_batches"), max_tokens=r.int("max_tokens"),
                cp=r.int("cp"), pad_id=r.int("pad_id"),
                image_token_id=r.optional("image_token_id", check_int, required=True),
                wait_s=r.float("wait_s"))


def _check_samples(r: Reader, columns: dict[str, np.ndarray], n: int, held_by: str) -> None:
    """Every per-sample column has one row per pulled row (``sample_ids`` three columns)."""
    for f in ("micro_batch", "position", "lengths", "sample_ids"):
        array = columns[f]
        if array.shape[0] != n or (f == "sample_ids" and array.shape[1:] != (3,)):
            raise r.fail(f, f"has shape {array.shape}, but the {held_by} hold {n} rows"
                         + (" (expected [n, 3])" if f == "sample_ids" else ""))


@dataclass(frozen=True, eq=False)
class ConstructPart(_ColumnsEqual, _BatchSettings, Message):
    """A construct task's argument: the batches of several DP groups of one step (a *part*), in
    one set of columns, read into one :class:`ConstructSpec` per group by :meth:`specs`.

    Why columns: a part at 16k GPUs holds 512 groups of two samples each, and a spec per group
    was about 40 objects (its pulls, their keys, index tuples and holder lists, its arrays) to
    build, pickle and unpickle on the scheduler's loop, twice (the client's graph, then the task
    to the worker). Here a part is a dozen arrays and two lists, whatever its size.

    Group ``g`` (DP rank ``dp_ranks[g]``) has samples ``sample_bounds[g]:sample_bounds[g + 1]``
    of the per-sample columns and pulls ``pull_bounds[g]:pull_bounds[g + 1]``; pull ``p`` takes
    rows ``indices`` (``pull_sizes[p]`` of them, in order) of the chunk ``pull_keys[p]``, held
    by ``holders[p]`` when the step was planned. The batch settings are the part's, once.
    """

    step: int
    dp_ranks: tuple[int, ...]
    sample_bounds: np.ndarray
    pull_bounds: np.ndarray
    pull_keys: tuple[tuple, ...]
    pull_sizes: np.ndarray
    holders: tuple[tuple[str, ...], ...]
    indices: np.ndarray
    micro_batch: np.ndarray
    position: np.ndarray
    lengths: np.ndarray
    sample_ids: np.ndarray

    _ARRAYS = ("sample_bounds", "pull_bounds", "pull_sizes", "indices", "micro_batch", "position",
               "lengths", "sample_ids")
    _SETTINGS = _BatchSettings.FIELDS

    def __len__(self) -> int:
        return len(self.dp_ranks)

    @classmethod
    def of(cls, specs: "list[ConstructSpec]") -> "ConstructPart":
        """The part of these groups' specs (one step, the same settings): what the runtime
        builds from a step's columns directly, made from specs (tests, tools)."""
        if not specs:
            raise ValueError("a part holds at least one group")
        first = specs[0]
        pulls = [pull for spec in specs for pull in spec.chunks]
        return cls(
            step=first.step, dp_ranks=tuple(spec.dp_rank for spec in specs),
            sample_bounds=np.cumsum([0] + [spec.lengths.size for spec in specs]),
            pull_bounds=np.cumsum([0] + [len(spec.chunks) for spec in specs]),
            pull_keys=tuple(pull.key for pull in pulls),
            pull_sizes=np.array([len(pull.indices) for pull in pulls], np.int64),
            holders=tuple(pull.who_has for pull in pulls),
            indices=np.array([i for pull in pulls for i in pull.indices], np.int64),
            micro_batch=np.concatenate([spec.micro_batch for spec in specs]),
            position=np.concatenate([spec.position for spec in specs]),
            lengths=np.concatenate([spec.lengths for spec in specs]),
            sample_ids=np.concatenate([spec.sample_ids.reshape(-1, 3) for spec in specs]),
            **{f: getattr(first, f) for f in cls._SETTINGS})

    def specs(self) -> list[ConstructSpec]:
        """One :class:`ConstructSpec` per group, in ``dp_ranks`` order."""
        sb, pb = self.sample_bounds.tolist(), self.pull_bounds.tolist()
        ends = np.cumsum(self.pull_sizes).tolist()
        starts = [0] + ends[:-1]
        indices = self.indices.tolist()
        pulls = [ChunkPull(key, tuple(indices[a:b]), holders)
                 for key, a, b, holders in zip(self.pull_keys, starts, ends, self.holders)]
        settings = {f: getattr(self, f) for f in self._SETTINGS}
        return [ConstructSpec(
            step=self.step, dp_rank=dp, chunks=tuple(pulls[pb[g]:pb[g + 1]]),
            micro_batch=self.micro_batch[sb[g]:sb[g + 1]], position=self.position[sb[g]:sb[g + 1]],
            lengths=self.lengths[sb[g]:sb[g + 1]], sample_ids=self.sample_ids[sb[g]:sb[g + 1]],
            **settings) for g, dp in enumerate(self.dp_ranks)]

    def to_msg(self) -> dict[str, Any]:
        out: dict[str, Any] = {f: getattr(self, f) for f in self._ARRAYS}
        out.update(step=self.step, dp_ranks=list(self.dp_ranks),
                   pull_keys=[key_msg(k) for k in self.pull_keys],
                   holders=[list(h) for h in self.holders],
                   **{f: getattr(self, f) for f in self._SETTINGS})
        return out

    @classmethod
    def from_msg(cls, msg: Any) -> "ConstructPart":
        r = Reader(cls.__name__, msg)
        dp_ranks = int_tuple(r.raw("dp_ranks"), r, "dp_ranks")
        arrays = {f: int_array(r.raw(f), r, f, ndim=2 if f == "sample_ids" else 1) for f in cls._ARRAYS}
        keys = r.list("pull_keys", key_of)
        holders = r.list("holders", list_of(check_str))
        out = cls(step=r.int("step"), dp_ranks=dp_ranks, pull_keys=keys, holders=holders, **arrays,
                  **_read_settings(r))
        r.done()
        out._check(r)
        return out

    def _check(self, r: Reader) -> None:
        """The columns agree: bounds run from 0 over every sample and pull, each group's pulls
        hold as many rows as it has samples, every per-sample column has one row per sample."""
        groups, n, pulls = len(self.dp_ranks), self.indices.size, len(self.pull_keys)
        if not groups:
            raise r.fail("dp_ranks", "must name at least one group")
        for name, bounds, total in (("sample_bounds", self.sample_bounds, n),
                                    ("pull_bounds", self.pull_bounds, pulls)):
            if bounds.size != groups + 1 or bounds[0] != 0 or bounds[-1] != total \
                    or np.any(np.diff(bounds) < 0):
                raise r.fail(name, f"must rise from 0 to {total} in {groups + 1} steps, "
                                   f"got {bounds.tolist()[:8]!r:.80}")
        if self.pull_sizes.size != pulls or len(self.holders) != pulls \
                or np.any(self.pull_sizes < 0) or int(self.pull_sizes.sum()) != n:
            raise r.fail("pull_sizes", f"must give each of {pulls} pulls its rows, {n} in all")
        rows = np.concatenate([[0], np.cumsum(self.pull_sizes)])[self.pull_bounds]
        if not np.array_equal(rows, self.sample_bounds):
            raise r.fail("pull_sizes", "each group's pulls must hold as many rows as it has samples")
        _check_samples(r, {f: getattr(self, f) for f in self._ARRAYS}, n, "pulls")


# -- constructor -> Planner ----------------------------------------------------------------------
def _addresses(value: Any, r: Reader, name: str) -> tuple[str, ...] | None:
    return None if value is None else list_of(check_str)(value, r, name)


@dataclass(frozen=True)
class WhoHasReply(Message):
    """Per key: the workers holding it, or None when the scheduler forgot it (its job released
    it: nobody will load it again)."""

    who_has: tuple[tuple[str, ...] | None, ...]

    def to_msg(self) -> dict[str, Any]:
        return {"who_has": [None if w is None else list(w) for w in self.who_has]}

    @classmethod
    def from_msg(cls, msg: Any) -> "WhoHasReply":
        r = Reader(cls.__name__, msg)
        out = cls(r.list("who_has", _addresses))
        r.done()
        return out


@dataclass(frozen=True)
class WhoHasRequest(Request):
    """Where do these chunk task keys live now?"""

    handler = Handler.WHO_HAS
    reply = WhoHasReply

    keys: tuple[tuple, ...]

    def to_msg(self) -> dict[str, Any]:
        return {"keys": [key_msg(k) for k in self.keys]}

    @classmethod
    def from_msg(cls, msg: Any) -> "WhoHasRequest":
        r = Reader(cls.__name__, msg)
        out = cls(r.list("keys", key_of))
        r.done()
        return out


# -- worker handlers -----------------------------------------------------------------------------
@dataclass(frozen=True)
class TakeRowsReply(Message):
    """``OK`` with the requested rows (a :class:`SampleChunk`), or ``MISSING`` with the ``key``."""

    status: Status
    key: tuple
    chunk: SampleChunk | None = None

    def to_msg(self) -> dict[str, Any]:
        return held_msg(self.status, self.key, "chunk", self.chunk)

    @classmethod
    def from_msg(cls, msg: Any) -> "TakeRowsReply":
        r = Reader(cls.__name__, msg)
        out = cls(*read_held(r, "chunk", SampleChunk))
        r.done()
        return out


@dataclass(frozen=True)
class TakeRowsRequest(Request):
    """Rows ``indices`` (positions among the chunk's kept rows) of the chunk held under ``key``."""

    handler = Handler.TAKE_ROWS
    reply = TakeRowsReply

    key: tuple
    indices: tuple[int, ...]

    def to_msg(self) -> dict[str, Any]:
        return {"key": key_msg(self.key), "indices": list(self.indices)}

    @classmethod
    def from_msg(cls, msg: Any) -> "TakeRowsRequest":
        r = Reader(cls.__name__, msg)
        out = cls(key_of(r.raw("key"), r, "key"), int_tuple(r.raw("indices"), r, "indices"))
        r.done()
        return out


@dataclass(frozen=True)
class TakeRowsManyReply(Message):
    """One :class:`TakeRowsReply` per chunk asked for, in the request's order."""

    replies: tuple[TakeRowsReply, ...]

    def to_msg(self) -> dict[str, Any]:
        return {"replies": [reply.to_msg() for reply in self.replies]}

    @classmethod
    def from_msg(cls, msg: Any) -> "TakeRowsManyReply":
        r = Reader(cls.__name__, msg)
        out = cls(r.list("replies", lambda value, _r, _name: TakeRowsReply.from_msg(value)))
        r.done()
        return out


@dataclass(frozen=True)
class TakeRowsManyRequest(Request):
    """Several :class:`TakeRowsRequest` to one loader, answered together."""

    handler = Handler.TAKE_ROWS_MANY
    reply = TakeRowsManyReply

    pulls: tuple[TakeRowsRequest, ...]

    def to_msg(self) -> dict[str, Any]:
        return {"pulls": [pull.to_msg() for pull in self.pulls]}

    @classmethod
    def from_msg(cls, msg: Any) -> "TakeRowsManyRequest":
        r = Reader(cls.__name__, msg)
        out = cls(r.list("pulls", lambda value, _r, _name: TakeRowsRequest.from_msg(value)))
        r.done()
        return out
