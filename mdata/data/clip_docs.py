"""Interleaved video documents for the example corpus: passages of the plays with clips between them.

Video-language pre-training mixes captioned clips with documents where text and several clips
alternate. The corpus has both materials already (scenes of the plays, clips rendered from its
photographs by :mod:`mdata.data.clips`), so a document here is the opening paragraphs of a scene
with ``k`` clips between them, ``k`` cycling 0, 1, 2, 3 so that every count occurs (a document
without a clip is plain text, as in real interleaved corpora). Each clip sits where its
``<video>`` marker is, followed by its caption, and comes in the row's ``videos`` list
(``list<binary>``, the shape image documents use) in the markers' order. Nothing is downloaded;
builds repeat byte for byte (:mod:`mdata.data.clips` encodes deterministically).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mdata.data.clips import plan_clips, render_clip

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["MARKER", "MAX_CLIPS", "clip_document_table"]

#: The clip placeholder in a document's text (what ``DecodeVideoDocument`` splits on).
MARKER = "<video>"
#: Clips per document cycle 0 .. MAX_CLIPS.
MAX_CLIPS = 3


def _segments(text: str, count: int, per: int = 2, max_chars: int = 600) -> list[str]:
    """``count`` text segments of ``per`` paragraphs each from the start of ``text``, each cut to
    ``max_chars`` (at a word); empty ones when the text runs out."""
    paras = [p.strip() for p in text.split("\n\n") if p.strip()]
    out = []
    for j in range(count):
        seg = "\n\n".join(paras[j * per:(j + 1) * per])
        out.append(seg if len(seg) <= max_chars else seg[:max_chars].rsplit(" ", 1)[0] + " ...")
    return out


def clip_document_table(photos: Sequence[Any], passages: Sequence[tuple[str, str]], *, docs: int,
                        seconds: float, fps: int) -> "pa.Table":
    """``docs`` documents: document ``d`` takes the ``d``-th of ``passages`` (``(title, text)``,
    spread by the caller) and ``d % (MAX_CLIPS + 1)`` clips of photographs cycling over
    ``photos``; columns ``text``, ``videos``, ``clips``, ``title``, ``origins``."""
    import pyarrow as pa

    from mdata.data.crops import decode_rgb

    columns: dict[str, list[Any]] = {k: [] for k in ("text", "videos", "clips", "title", "origins")}
    decoded: dict[int, Any] = {}
    used = 0
    for d in range(docs):
        title, text = passages[d % len(passages)]
        k = d % (MAX_CLIPS + 1)
        paras = _segments(text, k + 1)
        parts, videos, origins = [paras[0]], [], []
        for j, spec in enumerate(plan_clips(d, k, seconds=seconds, fps=fps)):
            index = used % len(photos)
            used += 1
            if index not in decoded:
                decoded[index] = decode_rgb(photos[index].data)
            clip = render_clip(decoded[index], spec, photos[index].subject)
            videos.append(clip.data)
            origins.append(photos[index].origin)
            parts += [f"{MARKER}\n({clip.caption})", paras[j + 1]]
        for key, value in (("text", "\n\n".join(p for p in parts if p)), ("videos", videos),
                           ("clips", k), ("title", title), ("origins", origins)):
            columns[key].append(value)
    schema = pa.schema([pa.field("text", pa.string(), nullable=False),
                        pa.field("videos", pa.list_(pa.binary()), nullable=False),
                        pa.field("clips", pa.int32(), nullable=False),
                        pa.field("title", pa.string(), nullable=False),
                        pa.field("origins", pa.list_(pa.string()), nullable=False)])
    return pa.table(columns, schema=schema)
