"""Media spans: where each clip (or image) of an interleaved document sits in its token sequence.

A sample with one medium (a captioned image, a captioned clip) needs no layout: its image tokens
go before its text (:mod:`mdata.batch`). An interleaved document holds several media between its
text segments, and a model must see each medium's patches where the document puts it. The
sample keeps the shape every image sample has (one ``(rows, width, 3)`` image: its media stacked
top to bottom, ``num_patches`` their sum, text tokens apart), and adds one row per medium, in
order, to an int32 ``[k, 3]`` array:

* ``at``: the number of the sample's text tokens before the medium's placeholders;
* ``patches``: the medium's image tokens;
* ``rows``: the image rows it takes (a clip: frames x frame height).

So ``spans[:, 1].sum() == num_patches`` and ``spans[:, 2].sum() == image.shape[0]``, and ``at``
never decreases. Constructors place each medium's placeholders at ``at`` (cut to the text a
truncation kept) and hand the trainer each medium as an image of its own
(:func:`mdata.batch.documents.lay_out_document`). Numpy only, no decoder.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SPAN_COLUMNS", "clamp_spans", "span_problem"]

#: The columns of a spans array, in order.
SPAN_COLUMNS = ("at", "patches", "rows")


def span_problem(spans: np.ndarray, *, text_tokens: int, num_patches: int, image_rows: int) -> str | None:
    """Why ``spans`` cannot describe a sample of ``text_tokens`` text tokens, ``num_patches``
    image tokens and an image of ``image_rows`` rows; None when it can."""
    spans = np.asarray(spans)
    if spans.ndim != 2 or spans.shape[1] != 3 or not np.issubdtype(spans.dtype, np.integer):
        return f"spans must be an int [k, 3] array (at, patches, rows), got {spans.dtype} {spans.shape}"
    at, patches, rows = spans[:, 0], spans[:, 1], spans[:, 2]
    if (at < 0).any() or (at > text_tokens).any() or (np.diff(at) < 0).any():
        return f"span positions {at.tolist()} must rise within the text's {text_tokens} tokens"
    if (patches < 1).any() or (rows < 1).any():
        return f"every span needs patches and rows >= 1, got {spans.tolist()}"
    if int(patches.sum()) != num_patches or int(rows.sum()) != image_rows:
        return (f"spans hold {int(patches.sum())} patches in {int(rows.sum())} image rows, the sample "
                f"{num_patches} patches in {image_rows} rows")
    return None


def clamp_spans(spans: np.ndarray, text_tokens: int) -> np.ndarray:
    """``spans`` with every position cut to ``text_tokens`` (what a truncation kept of the text):
    a medium whose text was cut away follows what is left, and keeps all its patches."""
    if spans.size == 0 or int(spans[:, 0].max()) <= text_tokens:
        return spans
    out = spans.copy()
    np.minimum(out[:, 0], text_tokens, out=out[:, 0])
    return out
