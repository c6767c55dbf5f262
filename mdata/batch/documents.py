"""One document's tokens in its micro-batch: text, and each medium's placeholders where it sits.

An image-text sample puts its one image's placeholders before its caption. An interleaved
document (text segments and several clips, :mod:`mdata.sources.spans`) puts each clip's
placeholders at its place in the text, so attention, the context-parallel split and the labels
see the clips where the document has them. Both are laid out here, for the packer
(:mod:`mdata.batch.packing`); numpy only.
"""

from __future__ import annotations

import numpy as np

__all__ = ["lay_out_document"]


def lay_out_document(
    doc: np.ndarray,
    target: np.ndarray,
    text: np.ndarray,
    spans: np.ndarray | None,
    patches: int,
    image_token_id: int | None,
    ignore_index: int,
) -> list[tuple[int, int]]:
    """Fill ``doc`` (the document's slice of ``input_ids``) and ``target`` (its slice of
    ``labels``) from ``text`` (the text tokens kept) and the media, and return each medium's
    ``(rows, patches)`` in order: the rows of the sample's stacked image it takes.

    ``spans`` None: one medium of ``patches`` placeholders before the text (an image or clip
    sample). Otherwise its ``(at, patches, rows)`` rows: medium ``k``'s placeholders follow the
    first ``at`` text tokens (cut to ``len(text)``). A position whose target is a placeholder is
    ``ignore_index`` (image tokens are inputs, never predictions)."""
    length = len(doc)
    if spans is None or len(spans) == 0:
        if patches:
            doc[:patches] = image_token_id
        doc[patches:] = text
        target[: length - 1] = doc[1:]
        target[: max(patches - 1, 0)] = ignore_index
        return [(-1, patches)] if patches else []
    at = np.minimum(spans[:, 0].astype(np.int64), len(text))
    counts = spans[:, 1].astype(np.int64)
    starts = at + np.concatenate(([0], np.cumsum(counts)[:-1]))  # each run's first position
    media = np.zeros(length, dtype=bool)
    runs = np.repeat(starts - np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
    media[np.arange(int(counts.sum())) + runs] = True
    doc[media] = image_token_id
    doc[~media] = text
    target[: length - 1] = doc[1:]
    target[: length - 1][media[1:]] = ignore_index
    return [(int(r), int(c)) for r, c in zip(spans[:, 2], counts)]
