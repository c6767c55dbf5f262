"""Batches: what a constructor builds for one DP group and what each trainer rank receives.

This package is numpy only (no torch, no dask), so constructor workers stay lean (torch adds
~180 MB per process, see docs/dev/architecture.md); trainers turn batches into tensors with
:func:`mdata.trainer.tensors.batch_to_torch`. Modules: :mod:`~mdata.batch.micro` (``MicroBatch``,
``TensorField``), :mod:`~mdata.batch.views` (the CP zigzag split and pipeline cut of one rank),
:mod:`~mdata.batch.batches` (``Batch``, ``DPBatch``), :mod:`~mdata.batch.packing`
(``build_dp_batch``); every public name is importable from ``mdata.batch``.

Layout of one micro-batch (the conventions every consumer relies on)
--------------------------------------------------------------------
* **Packing.** A micro-batch is one sequence: its documents (samples) concatenated in the order
  of their planned ``position``, each truncated to its planned length.
* **Image samples.** An image-text sample contributes ``num_patches`` copies of a reserved
  ``image_token_id`` *before* its caption tokens. A ``SampleChunk`` holds only the caption's token
  ids; its ``num_tokens`` (the cost feature) counts both, so ``len(caption) + num_patches ==
  num_tokens`` for every sample. Truncation cuts the caption's tail, never into the image run.
  The micro-batch carries the images' raw pixels concatenated (``pixels``, uint8, flat),
  ``image_shapes`` (int32 ``[k, 3]``, H x W x C) and ``image_token_counts`` (int32 ``[k]``), in
  document order; the first ``image_token_counts[0]`` placeholders belong to image 0, and so on.
  An interleaved document (:mod:`mdata.sources.spans`) puts each medium's placeholders at its
  place in the text instead, and each of its media is an image of its own.
* **Labels** are next-token targets, already shifted: ``labels[t] = input_ids[t + 1]`` inside a
  document. The last token of every document, padding, and every position whose target is an
  image placeholder get ``ignore_index`` (image tokens are inputs, never predictions).
* **Position ids** restart at 0 for every document (and for the trailing padding run).
* **Padding.** With context parallelism (``cp > 1``) every document is padded at its end to a
  multiple of ``2 * cp`` so it splits into ``2 * cp`` equal chunks (the zigzag split below; the same
  rule as TransformerEngine's THD layout and ring-flash-attention's zigzag varlen kernels). The
  sequence is then padded at its end to a multiple of ``lcm(2 * cp, pad_to_multiple)``.
  Padding uses ``pad_id`` and ``ignore_index`` labels.
* **cu_seqlens** (int32 ``[docs + 1]``) are the cumulative *padded* document lengths; with
  ``cp == 1`` there is no per-document padding, so they are the usual real-token boundaries.
  ``seqlens`` (int32 ``[docs]``) keeps the real (unpadded) lengths. Trailing padding lies after
  ``cu_seqlens[-1]`` and belongs to no document.

Context-parallel split (``DPBatch.for_rank``)
---------------------------------------------
Each document (and the trailing padding) is cut into ``2 * cp`` equal chunks; CP rank ``i`` gets
chunks ``i`` and ``2 * cp - 1 - i`` of every document, in document order. Under a causal mask the
early chunk is cheap and the late one expensive, so every rank gets the same attention work
(load-balanced ring attention). A rank's ``cu_seqlens`` are the global ones divided by ``cp`` (the
boundaries of its local document pieces); ``cu_seqlens_global`` and ``seqlens`` describe the
whole sequence; ``position_ids`` are each local token's position inside its document.

Under ``broadcast_at("cp")`` only CP rank 0 of each group receives, and it receives the whole
sequence (``DPBatch.for_rank(None)``, ``Batch.cp_rank is None``); it broadcasts it to its CP group
and every member cuts its own slice with ``Batch.cp_slice(cp_rank)`` (or ``zigzag_indices`` on
tensors), the same cut the constructor would have made.

Pipeline stages: the first stage receives tokens (``input_ids``, ``position_ids``, images), the
last receives ``labels``, middle stages only metadata (``cu_seqlens*``, ``seqlens``, sample ids,
``seq_len``): bytes go only where a stage reads them.

Dtypes: numpy has no bfloat16, so such fields travel as :class:`TensorField` (a dtype name, a
shape and a raw ``uint16`` buffer) and become ``torch.bfloat16`` on the trainer without a copy.
"""

from mdata.batch.batches import Batch, DPBatch
from mdata.batch.micro import (
    IMAGE_FIELDS,
    LABEL_FIELDS,
    RAW_DTYPES,
    TOKEN_FIELDS,
    FieldValue,
    MicroBatch,
    TensorField,
)
from mdata.batch.packing import build_dp_batch
from mdata.batch.views import rank_view, zigzag_indices

__all__ = [
    "TensorField",
    "FieldValue",
    "MicroBatch",
    "Batch",
    "DPBatch",
    "RAW_DTYPES",
    "TOKEN_FIELDS",
    "LABEL_FIELDS",
    "IMAGE_FIELDS",
    "zigzag_indices",
    "rank_view",
    "build_dp_batch",
]
