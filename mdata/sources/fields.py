"""Field kinds: what a transform expects of a column, checked against a shard's schema.

Transforms declare the fields they read and the kind of value they need (text or bytes). Readers
check that declaration against the shard's schema (the Parquet footer, or each JSON value) before
any transform runs, so a wrong column type fails with a :class:`~mdata.errors.SchemaError` naming
the field and both types, instead of an obscure error deep inside a tokenizer.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pyarrow is imported where a schema is checked: readers, not specs or trainers
    import pyarrow as pa

__all__ = ["FieldKind", "arrow_type_problem", "bytes_child"]


class FieldKind(str, Enum):
    """The kind of value a transform reads from a field."""

    #: A UTF-8 string (Arrow ``string``/``large_string``/``string_view``; a JSON string).
    TEXT = "text"
    #: Raw bytes (Arrow ``binary``/``large_binary``/``binary_view``, or a Hugging Face
    #: ``datasets`` image struct ``{bytes, path}``; in JSONL a base64 string).
    BYTES = "bytes"
    #: Anything; the transform checks values itself.
    ANY = "any"


def bytes_child(t: pa.DataType) -> int | None:
    import pyarrow as pa

    """Index of the binary ``bytes`` child of a Hugging Face image struct, or None."""
    if pa.types.is_struct(t):
        for i in range(t.num_fields):
            f = t.field(i)
            if f.name == "bytes" and _is_binary(f.type):
                return i
    return None


def _is_binary(t: pa.DataType) -> bool:
    import pyarrow as pa

    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t)


def _is_text(t: pa.DataType) -> bool:
    import pyarrow as pa

    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def arrow_type_problem(kind: FieldKind, t: pa.DataType) -> str | None:
    """Why Arrow type ``t`` cannot feed a field of ``kind``, or None when it can."""
    if kind is FieldKind.ANY:
        return None
    if kind is FieldKind.TEXT and not _is_text(t):
        return f"has type {t}, expected a string column"
    if kind is FieldKind.BYTES and not (_is_binary(t) or bytes_child(t) is not None):
        return f"has type {t}, expected a binary column (or an image struct with a 'bytes' field)"
    return None
