"""The vocabulary of mdata's messages: handler names, reply statuses, and how fields are read.

Every message class of :mod:`mdata.wire.messages` is a frozen dataclass with ``to_msg()`` (plain
data: what Dask's comms carry as msgpack) and ``from_msg(msg)``, which reads each field through a
:class:`Reader`. A Reader checks the field's type, converts what msgpack changes on the way (lists
arrive as tuples, ``bytes`` may arrive as ``bytearray``) and raises a
:class:`~mdata.wire.errors.MessageError` naming the message and the field, so a malformed message
fails where it is read, with a sentence, instead of as a ``KeyError`` three calls later.
"""

from __future__ import annotations

import enum
import numbers
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import numpy as np

from mdata.wire.errors import MessageError, bad_field, bad_message

__all__ = ["Handler", "Status", "Message", "Request", "Reader", "plain", "key_of", "key_msg",
           "int_array", "int_tuple", "serialized", "held_msg", "read_held"]

T = TypeVar("T")


class Handler(str, enum.Enum):
    """Every mdata handler: on the scheduler (the Planner) and on workers (loaders, constructors).

    The value is the name Dask dispatches on (``client.scheduler.<value>(...)``).
    """

    # scheduler: the Planner plugin
    REGISTER_JOB = "mdata_register_job"
    BATCH_LOCATION = "mdata_batch_location"
    HOST_LOCATION = "mdata_host_location"  # the batch_location of every rank of one process at once
    CONSUMED = "mdata_consumed"  # what the training loops of one process' ranks consumed
    ACK = "mdata_ack"
    REPORT_METRICS = "mdata_report_metrics"
    CHECKPOINT = "mdata_checkpoint"
    STORY = "mdata_story"
    LINEAGE = "mdata_lineage"
    STATUS = "mdata_status"
    JOB_STORAGE_WAITS = "mdata_job_storage_waits"  # a late Loader: does the job wait on storage?
    JOBS = "mdata_jobs"
    JOB_INFO = "mdata_job_info"
    WHO_HAS = "mdata_who_has"
    CLOSE_JOB = "mdata_close_job"
    ATTACH = "mdata_attach"
    DETACH = "mdata_detach"
    # workers: loaders serve rows, constructors serve batches
    TAKE_ROWS = "mdata_take_rows"
    TAKE_ROWS_MANY = "mdata_take_rows_many"  # several chunks of one loader in one round trip
    GET_BATCH = "mdata_get_batch"
    STORAGE_WAITS = "mdata_storage_waits"  # any mdata worker: its sources waiting on storage
    SET_ROLE = "mdata_set_role"  # loader pools: promote a standby, demote a returning loader
    SCALER_REPORT = "mdata_scaler_report"  # scheduler: a pool autoscaler's status and decisions

    def __str__(self) -> str:
        return self.value


WORKER_HANDLERS = (Handler.TAKE_ROWS, Handler.TAKE_ROWS_MANY, Handler.GET_BATCH, Handler.STORAGE_WAITS,
                   Handler.SET_ROLE)
SCHEDULER_HANDLERS = tuple(h for h in Handler if h not in WORKER_HANDLERS)


class Status(str, enum.Enum):
    """The outcome a reply reports (the ``status`` field)."""

    OK = "OK"
    FAILED = "failed"  # the job failed, or this batch could not be built: the reply says why
    TIMEOUT = "timeout"  # not ready within the request's long-poll timeout: ask again
    MISSING = "missing"  # this worker does not hold the key (it moved, or was released)

    def __str__(self) -> str:
        return self.value


class Message:
    """Base of every request and reply (each a frozen dataclass)."""

    def to_msg(self) -> Any:
        """Plain data for the wire (dicts, lists, str, int, float, bool, bytes, None)."""
        raise NotImplementedError

    @classmethod
    def from_msg(cls: type[T], msg: Any) -> T:
        """Read and check a message built by :meth:`to_msg` (possibly after msgpack)."""
        raise NotImplementedError


class Request(Message):
    """A message that calls a handler; ``handler`` names it, ``reply`` is the class of its answer.

    ``to_msg()`` of a request is the handler's keyword arguments.
    """

    handler: ClassVar[Handler]
    reply: ClassVar[type[Message]]


def plain(value: Any) -> Any:
    """Free-form payloads (lineage events, checkpoints, step summaries) as fresh plain data:
    the tuples msgpack delivers for lists become lists again, numpy scalars Python numbers."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


_MISSING = object()


class Reader:
    """Reads the fields of one message, naming the message in every error.

    ``done()`` rejects fields nobody read (a misspelt keyword would otherwise be ignored).
    """

    def __init__(self, name: str, msg: Any) -> None:
        self.name = name
        if not isinstance(msg, Mapping):
            raise bad_message(name, f"expected a dict of fields, got {type(msg).__name__} {msg!r:.200}")
        self.msg = msg
        self._read: set[str] = set()

    def fail(self, field: str, problem: str) -> MessageError:
        return bad_field(self.name, field, problem)

    def raw(self, field: str, default: Any = _MISSING) -> Any:
        self._read.add(field)
        if field in self.msg:
            return self.msg[field]
        if default is _MISSING:
            raise self.fail(field, f"is missing (fields present: {sorted(map(str, self.msg))})")
        return default

    def done(self) -> None:
        extra = sorted(str(k) for k in self.msg if k not in self._read)
        if extra:
            raise self.fail(extra[0], f"is not a field of this message (unexpected: {extra})")

    # -- scalars -------------------------------------------------------------------------------
    def str(self, field: str) -> str:
        return check_str(self.raw(field), self, field)

    def int(self, field: str) -> int:
        return check_int(self.raw(field), self, field)

    def float(self, field: str) -> float:
        return check_float(self.raw(field), self, field)

    def bool(self, field: str) -> bool:
        return check_bool(self.raw(field), self, field)

    def bytes(self, field: str) -> bytes:
        value = self.raw(field)
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise self.fail(field, f"must be bytes, got {type(value).__name__}")
        return bytes(value)

    def optional(self, field: str, read: Callable[[Any, "Reader", str], T], *,
                 required: bool = False) -> T | None:
        """A value or None; ``required``: the field must be present even when None."""
        value = self.raw(field) if required else self.raw(field, None)
        return None if value is None else read(value, self, field)

    def enum(self, field: str, kind: type[T]) -> T:
        value = self.raw(field)
        try:
            return kind(value)  # type: ignore[call-arg]
        except ValueError:
            choices = [m.value for m in kind]  # type: ignore[attr-defined]
            raise self.fail(field, f"must be one of {choices}, got {value!r}") from None

    # -- containers ----------------------------------------------------------------------------
    def list(self, field: str, item: Callable[[Any, "Reader", str], T]) -> tuple[T, ...]:
        return check_list(self.raw(field), self, field, item)

    def mapping(self, field: str, value: Callable[[Any, "Reader", str], T]) -> dict[str, T]:
        return check_mapping(self.raw(field), self, field, value)

    def dict(self, field: str) -> dict[str, Any]:
        """A free-form dict (see :func:`plain`)."""
        return check_dict(self.raw(field), self, field)


# -- checks usable as item readers: (value, reader, field) -> value ---------------------------------
def check_str(value: Any, r: Reader, field: str) -> str:
    if not isinstance(value, str):
        raise r.fail(field, f"must be a string, got {type(value).__name__} {value!r:.80}")
    return value


def check_int(value: Any, r: Reader, field: str) -> int:
    if type(value) is int:  # the common case, without the slower abstract-class checks below
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise r.fail(field, f"must be an integer, got {type(value).__name__} {value!r:.80}")
    return int(value)


def check_float(value: Any, r: Reader, field: str) -> float:
    if type(value) is float:
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise r.fail(field, f"must be a number, got {type(value).__name__} {value!r:.80}")
    return float(value)


def check_bool(value: Any, r: Reader, field: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise r.fail(field, f"must be true or false, got {type(value).__name__} {value!r:.80}")
    return bool(value)


def check_dict(value: Any, r: Reader, field: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise r.fail(field, f"must be a dict, got {type(value).__name__} {value!r:.80}")
    return plain(value)


def check_list(value: Any, r: Reader, field: str, item: Callable[[Any, Reader, str], T]) -> tuple[T, ...]:
    if not isinstance(value, (list, tuple)):
        raise r.fail(field, f"must be a list, got {type(value).__name__} {value!r:.80}")
    plain = _PLAIN_ITEMS.get(item)  # a list of plain ints (floats, strings) is taken whole:
    if plain is not None and all(type(v) is plain for v in value):  # no name made per item
        return tuple(value)
    return tuple(item(v, r, f"{field}[{i}]") for i, v in enumerate(value))


#: Item readers whose every value of exactly this type is read as it is (see check_list).
_PLAIN_ITEMS: dict[Callable[..., Any], type] = {check_int: int, check_float: float, check_str: str}


def check_mapping(value: Any, r: Reader, field: str, item: Callable[[Any, Reader, str], T]) -> dict[str, T]:
    if not isinstance(value, Mapping):
        raise r.fail(field, f"must be a dict, got {type(value).__name__} {value!r:.80}")
    out = {}
    for k, v in value.items():
        out[check_str(k, r, f"{field} key")] = item(v, r, f"{field}[{k}]")
    return out


def list_of(item: Callable[[Any, Reader, str], T]) -> Callable[[Any, Reader, str], tuple[T, ...]]:
    """An item reader for a list of ``item`` (for nested lists)."""
    return lambda value, r, field: check_list(value, r, field, item)


def key_of(value: Any, r: Reader, field: str) -> tuple:
    """A Dask task key: a non-empty list of strings and integers (nested lists allowed)."""
    if not isinstance(value, (list, tuple)) or not value:
        raise r.fail(field, f"must be a task key (a non-empty list), got {value!r:.80}")
    out = []
    for part in value:
        if isinstance(part, (list, tuple)):
            out.append(key_of(part, r, field))
        elif isinstance(part, (str, numbers.Integral)) and not isinstance(part, bool):
            out.append(part if isinstance(part, str) else int(part))
        else:
            raise r.fail(field, f"must hold strings and integers, got {part!r:.80}")
    return tuple(out)


def key_msg(key: tuple) -> list:
    """A task key as msgpack carries it (nested lists)."""
    return [key_msg(k) if isinstance(k, tuple) else k for k in key]


#: Arrays up to this many items travel inline (:func:`int_array_msg`).
INLINE_ITEMS = 64


def int_array_msg(array: np.ndarray, inline: int = INLINE_ITEMS) -> Any:
    """An integer array as a message carries it: a small one as ``[dtype, values]`` inside the
    message, a larger one as the array (its own buffer). Why: a pickled message sends every
    numpy array as a buffer of its own, and a construct task carries four small arrays per DP
    group (2 samples a group at 16k GPUs): 2,049 buffers for 512 groups, about 20 us per group
    to pickle and 28 to unpickle, against 2.5 and 4 inline, paid again at every hop."""
    array = np.asarray(array)
    return [array.dtype.str, array.tolist()] if array.size <= inline else array


def int_array(value: Any, r: Reader, name: str, *, ndim: int) -> np.ndarray:
    """An integer array (numpy, a list after msgpack, or ``[dtype, values]`` as
    :func:`int_array_msg` writes a small one) of ``ndim`` dimensions."""
    if isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[0], str):
        try:
            dtype = np.dtype(value[0])
        except TypeError:
            raise r.fail(name, f"names dtype {value[0]!r:.40}, not a numpy dtype") from None
        if dtype.kind not in "iu" or not isinstance(value[1], (list, tuple)):
            raise r.fail(name, f"must be [integer dtype, values], got {value!r:.80}")
        value = np.asarray(value[1], dtype=dtype) if value[1] else np.zeros(0, dtype)
    if not isinstance(value, (np.ndarray, list, tuple)):
        raise r.fail(name, f"must be an integer array, got {type(value).__name__}")
    array = np.asarray(value)
    if array.size == 0:  # an empty list has no integer dtype of its own
        array = array.astype(np.int64).reshape((0,) if ndim == 1 else (0, 3))
    if array.dtype.kind not in "iu" or array.ndim != ndim:
        raise r.fail(name, f"must be a {ndim}-d integer array, got {array.dtype} of shape {array.shape}")
    return array


def int_tuple(value: Any, r: Reader, name: str) -> tuple[int, ...]:
    """A list of integers (indices) as a tuple of Python ints."""
    return tuple(int_array(value, r, name, ndim=1).tolist())


def serialized(obj: Any) -> Any:
    """Wrap a batch or chunk so Dask sends it with its own frames (:mod:`mdata.wire.frames`)."""
    from distributed.protocol import to_serialize

    return to_serialize(obj)


def held_msg(status: Status, key: tuple, field: str, value: Any) -> dict[str, Any]:
    """A worker's answer about a value it holds under ``key``: ``OK`` with the value under
    ``field`` (serialized as frames), or ``MISSING`` with the key (it moved or was released)."""
    if status is Status.OK:
        return {"status": status.value, field: serialized(value)}
    return {"status": status.value, "key": key_msg(key)}


def read_held(r: "Reader", field: str, kind: type) -> tuple[Status, tuple, Any]:
    """Read what :func:`held_msg` wrote: (status, key, value) with the value of type ``kind``."""
    status = r.enum("status", Status)
    if status is Status.OK:
        value = r.raw(field)
        if not isinstance(value, kind):
            raise r.fail(field, f"must be a {kind.__name__}, got {type(value).__name__}")
        return status, (), value
    if status is Status.MISSING:
        return status, key_of(r.raw("key"), r, "key"), None
    raise r.fail("status", f"must be OK or missing, got {status.value!r}")

