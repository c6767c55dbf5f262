"""A step's checkpoint, packed to bytes once for every message that carries it.

Every pushed location and location reply carries the checkpoint of its step (what a rank's
``state_dict()`` records), and every client gets its own message: Dask encodes each message
for each connection anew. A checkpoint holds a few figures per source, so at 10,000 sources it
is about 290 KB and took 1.2 ms to encode, once per client and step: with 2,048 trainer hosts
that would be 2.5 s of the scheduler's event loop per step for one dict that is the same in
every message.

So the scheduler builds each step's checkpoint as a :class:`PackedCheckpoint`, a plain dict
that also holds its msgpack encoding, made once in the planning thread; a message then carries
the bytes (``checkpoint_msg``), which the transport copies as they are, and the reader unpacks
them (``unpacked``) with the options Dask's own decoder uses, so it reads the same dict a
plain message would have given. A plain dict still travels as before (older senders, tests).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack

__all__ = ["PackedCheckpoint", "checkpoint_msg", "unpacked"]


class PackedCheckpoint(dict):
    """A checkpoint dict (``Checkpoint.to_dict()``) with its msgpack bytes, packed on creation.
    Read-only by convention: the bytes are not packed again if the dict changes."""

    __slots__ = ("packed",)

    def __init__(self, checkpoint: Mapping[str, Any]) -> None:
        super().__init__(checkpoint)
        self.packed: bytes = msgpack.packb(dict(self), use_bin_type=True)


def checkpoint_msg(checkpoint: Any) -> Any:
    """What a message carries for ``checkpoint``: its packed bytes when it has them."""
    return checkpoint.packed if isinstance(checkpoint, PackedCheckpoint) else checkpoint


def unpacked(value: Any) -> Any:
    """A checkpoint as a message carried it: packed bytes unpacked (as Dask decodes a message:
    arrays as tuples, string keys), anything else as it is (the caller checks it)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return msgpack.unpackb(value, use_list=False, raw=False, strict_map_key=False)
        except (ValueError, msgpack.UnpackException) as exc:
            return f"<undecodable packed checkpoint: {exc}>"  # the caller's check names the field
    return value
