"""Typed errors across processes: an :class:`~mdata.errors.MdataError` as plain message data.

A failure on a loader worker (a corrupt shard), on a constructor (a batch that cannot be built) or
in the Planner reaches the trainer as the *same* subclass with the same fields, so a training
script can ``except CorruptShardError as e: quarantine(e.shard)`` instead of parsing text.

Dask already pickles exceptions raised inside handlers and tasks; but a job's failure is kept by
the Planner and handed to every trainer later, inside an ordinary reply (the batch-location reply
of :mod:`mdata.wire.messages`), so it needs a form that travels in a msgpack message:

    {"type": "CorruptShardError", "module": "mdata.errors",
     "bases": ["CorruptShardError", "SourceError", "MdataError"],
     "message": "line is not valid JSON: ...",
     "fields": {"source": "code", "shard": "/data/code/part-00001.jsonl", "row": 0, "hint": "..."},
     "notes": []}

The receiver rebuilds the class among the ``MdataError`` subclasses already imported in its own
process (never importing a module a message names): the exact class when it knows it, else the
nearest base it knows (``bases`` is the class's ``MdataError`` ancestry, most specific first), so a
worker-only subclass still arrives as, say, a ``SourceError`` with its fields. ``MessageError``
(a malformed message) lives here too: it is what every ``from_msg`` raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mdata.errors import (  # defined with every mdata error; the wire code raises them
    InvalidRequestError, MdataError, MessageError, NoHandlerError, SourceError,
)

__all__ = ["MessageError", "NoHandlerError", "InvalidRequestError", "bad_message", "bad_field",
           "error_to_msg", "error_from_msg"]

_PLAIN = (str, int, float, bool, type(None))
_SOURCE_FIELDS = ("source", "shard", "row", "hint")


def bad_message(message: str, problem: str) -> MessageError:
    """The error of a message that is not what its class expects at all."""
    return MessageError(
        f"malformed {message} message: {problem}; every mdata process (scheduler, workers, "
        "trainers, driver) must run the same mdata version"
    )


def bad_field(message: str, field: str, problem: str) -> MessageError:
    """The error every ``from_msg`` raises: which message, which field, what is wrong."""
    return bad_message(message, f"field {field!r} {problem}")


def error_to_msg(exc: MdataError) -> dict[str, Any]:
    """``exc`` as plain data: class name, ancestry, message, fields (plain values) and notes."""
    if not isinstance(exc, MdataError):
        raise TypeError(f"error_to_msg carries MdataError subclasses, not {type(exc).__name__}: {exc!r}")
    cls = type(exc)
    bases = [c.__name__ for c in cls.__mro__ if isinstance(c, type) and issubclass(c, MdataError)]
    if isinstance(exc, SourceError):
        message = str(exc.message)
    else:
        message = str(exc.args[0]) if len(exc.args) == 1 else str(exc)
    fields = {
        name: value for name, value in vars(exc).items()
        if not name.startswith("_") and name != "message" and isinstance(value, _PLAIN)
    }
    return {
        "type": cls.__name__,
        "module": cls.__module__,
        "bases": bases,
        "message": message,
        "fields": fields,
        "notes": [str(n) for n in getattr(exc, "__notes__", ())],
    }


def error_from_msg(msg: Any) -> MdataError:
    """Rebuild the error :func:`error_to_msg` described, as the most specific class known here."""
    name = "error"
    if not isinstance(msg, Mapping):
        raise bad_field(name, "error", f"must be a dict, got {type(msg).__name__}")
    for key, kind in (("type", str), ("module", str), ("message", str)):
        if not isinstance(msg.get(key), kind):
            raise bad_field(name, key, f"must be a {kind.__name__}, got {msg.get(key)!r}")
    bases = msg.get("bases", ())
    fields = msg.get("fields", {})
    notes = msg.get("notes", ())
    if not isinstance(bases, (list, tuple)) or not all(isinstance(b, str) for b in bases):
        raise bad_field(name, "bases", f"must be a list of class names, got {bases!r}")
    if not isinstance(fields, Mapping) or not all(isinstance(v, _PLAIN) for v in fields.values()):
        raise bad_field(name, "fields", f"must be a dict of plain values, got {fields!r}")
    if not isinstance(notes, (list, tuple)) or not all(isinstance(n, str) for n in notes):
        raise bad_field(name, "notes", f"must be a list of strings, got {notes!r}")
    cls = _resolve(msg["type"], msg["module"], bases)
    exc = _construct(cls, msg["message"], dict(fields))
    if cls.__name__ != msg["type"]:  # a class this process does not know: say what it was
        exc.add_note(f"raised as {msg['module']}.{msg['type']}")
    for note in notes:
        exc.add_note(note)
    return exc


def _known_classes() -> list[type[MdataError]]:
    """Every MdataError subclass imported in this process, the base first."""
    seen: list[type[MdataError]] = [MdataError]
    i = 0
    while i < len(seen):
        for sub in seen[i].__subclasses__():
            if sub not in seen:
                seen.append(sub)
        i += 1
    return seen


def _resolve(name: str, module: str, bases: list[str] | tuple[str, ...]) -> type[MdataError]:
    known = _known_classes()
    for cls in known:
        if cls.__name__ == name and cls.__module__ == module:
            return cls
    for base in (name, *bases):
        matches = [cls for cls in known if cls.__name__ == base]
        if matches:
            return matches[0]
    return MdataError


def _construct(cls: type[MdataError], message: str, fields: dict[str, Any]) -> MdataError:
    """Build ``cls``; a subclass whose constructor wants more than a message falls back to its
    nearest base that does not (the fields still travel as attributes)."""
    for candidate in cls.__mro__:
        if not (isinstance(candidate, type) and issubclass(candidate, MdataError)):
            continue
        try:
            if issubclass(candidate, SourceError):
                exc = candidate(message, **{k: fields.get(k) for k in _SOURCE_FIELDS if k != "source"},
                                source=fields.get("source"))
            else:
                exc = candidate(message)
        except TypeError:
            continue
        for key, value in fields.items():
            if not hasattr(exc, key) or getattr(exc, key) != value:
                try:
                    setattr(exc, key, value)
                except AttributeError:  # a read-only property: its value came from the message
                    pass
        return exc
    return MdataError(message)  # pragma: no cover - MdataError(message) always works
