"""The data-parallel baseline: what users run today, and what mdata's ratios are measured against.

Every trainer rank of the mesh (TP, CP and PP ranks included) runs its own
``torch.utils.data.DataLoader`` with ``W`` worker processes over :class:`MixingPackingDataset`.
Inside *each* worker:

* every source is opened (its own :class:`~mdata.sources.ReaderCache`, so its own listing, open
  Parquet readers and tokenizer per source): ``S x R x W`` copies of file-access state (sources x
  ranks x workers), where mdata opens each source only on the loader workers of its pool;
* each source is read as an endless stream of chunks (the source's own ``chunk_rows``, the same
  :func:`~mdata.sources.load_chunk` and transform as mdata's loader tasks), the chunk order a
  seeded permutation per epoch, dealt round-robin to the ``R x W`` workers, rows shuffled within
  the chunk;
* the next sample's source is a seeded random choice by weight (what typical loaders do: the
  mixture is right only in expectation);
* samples are packed next-fit into sequences of ``max_tokens`` (a sample longer than that is cut,
  as mdata cuts it), ``micro_batches`` sequences per rank per step, with no global view.

Ranks of one DP group (their TP/CP/PP peers) are seeded by their DP rank, as Megatron-style
loaders are, so they produce the same samples; each still runs its own loader. Nothing here is
specific to mdata's runtime: it is the comparison point, built from the same sources, transforms
and seeds.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from benchmarks.baseline_source import Sample, SourceStream, WeightedChooser
from mdata.sources import ReaderCache, Source

__all__ = [
    "IMAGE_TOKEN_ID",
    "MixingPackingDataset",
    "Packed",
    "make_loader",
    "pack_next_fit",
]

#: Placeholder id standing for one image patch in ``input_ids`` (cl100k ids stop at 100276).
IMAGE_TOKEN_ID = 100_300


@dataclass(frozen=True, eq=False)
class Packed:
    """One packed sequence: its samples (each cut to the context) in order."""

    samples: tuple[Sample, ...]
    lengths: tuple[int, ...]  # tokens each sample occupies (num_tokens cut to max_tokens)


def pack_next_fit(samples: Iterator[Sample], max_tokens: int, count: int,
                  carry: list[Sample] | None = None) -> list[Packed]:
    """Pack the next ``count`` sequences of at most ``max_tokens`` next-fit from ``samples``.

    A sample that does not fit closes the current sequence and opens the next; the one that
    overflows the last sequence is left in ``carry`` for the next call (nothing is dropped).
    """
    carry = carry if carry is not None else []
    out: list[Packed] = []
    current: list[Sample] = []
    lengths: list[int] = []
    used = 0
    while len(out) < count:
        sample = carry.pop() if carry else next(samples)
        length = min(sample.num_tokens, max_tokens)
        if current and used + length > max_tokens:
            out.append(Packed(tuple(current), tuple(lengths)))
            current, lengths, used = [], [], 0
            if len(out) == count:
                carry.append(sample)
                break
        current.append(sample)
        lengths.append(length)
        used += length
    return out


def _micro_batch(seq: Packed, max_tokens: int) -> dict:
    """Tensors of one packed sequence, as a packing loader hands them to the trainer."""
    import torch

    ids = np.zeros(max_tokens, dtype=np.int32)
    cu = np.zeros(len(seq.samples) + 1, dtype=np.int32)
    pos = 0
    images = []
    for k, (sample, length) in enumerate(zip(seq.samples, seq.lengths)):
        patches = min(sample.num_patches, length)
        ids[pos:pos + patches] = IMAGE_TOKEN_ID
        text = sample.tokens[: length - patches]
        ids[pos + patches:pos + patches + text.size] = text
        pos += length
        cu[k + 1] = pos
        if sample.image is not None:
            images.append(sample.image.reshape(-1))
    batch = {
        "input_ids": torch.from_numpy(ids),
        "cu_seqlens": torch.from_numpy(cu),
        "sample_ids": torch.tensor([[s.source_index, s.shard, s.row] for s in seq.samples],
                                   dtype=torch.int64),
    }
    if images:
        batch["pixels"] = torch.from_numpy(np.concatenate(images))
    return batch


class MixingPackingDataset:
    """The per-rank ``IterableDataset`` of the baseline (see the module docstring).

    Built lazily as a torch ``IterableDataset`` subclass by :func:`make_loader`, so importing this
    module does not import torch (the mixture figure uses the pure parts only).
    """

    def __init__(self, sources: Sequence[Source], weights: Mapping[str, float], *, max_tokens: int,
                 micro_batches: int, dp_rank: int, dp_size: int, seed: int = 0,
                 reader: str = "chunks") -> None:
        names = [s.name for s in sources]
        missing = [n for n in names if n not in weights]
        if missing:
            raise ValueError(f"no weight for sources {missing}")
        self.sources = tuple(sources)
        self.weights = [float(weights[n]) for n in names]
        self.max_tokens = int(max_tokens)
        self.micro_batches = int(micro_batches)
        self.dp_rank = int(dp_rank)
        self.dp_size = int(dp_size)
        self.seed = int(seed)
        if reader not in ("chunks", "stream"):
            raise ValueError(f"reader must be 'chunks' or 'stream', got {reader!r}")
        #: "chunks": SourceStream (load_chunk per chunk); "stream": streaming row groups with
        #: pyarrow's buffered reader (benchmarks/baseline_stream.py), for production row groups.
        self.reader = reader

    def steps(self, worker: int, num_workers: int) -> Iterator[dict]:
        """The endless batches of one worker: each opens every source, mixes, packs."""
        cache = ReaderCache(max_readers=max(64, 4 * len(self.sources)))
        global_index = self.dp_rank * num_workers + worker
        num_streams = self.dp_size * num_workers
        if self.reader == "stream":
            from benchmarks.baseline_stream import StreamingSourceStream as stream_class
        else:
            stream_class = SourceStream
        streams = [stream_class(src, i, index=global_index, num_streams=num_streams,
                                seed=self.seed, cache=cache) for i, src in enumerate(self.sources)]
        for stream in streams:
            stream.open()
        chooser = WeightedChooser(self.weights, (self.seed, self.dp_rank, worker))

        def mixed() -> Iterator[Sample]:
            while True:
                for k in chooser.choose(256).tolist():
                    yield streams[k].next()

        samples = mixed()
        carry: list[Sample] = []
        while True:
            packed = pack_next_fit(samples, self.max_tokens, self.micro_batches, carry)
            yield {"micro_batches": [_micro_batch(seq, self.max_tokens) for seq in packed],
                   "worker": worker}


def make_loader(dataset: MixingPackingDataset, num_workers: int, *, prefetch_factor: int = 2):
    """A ``torch.utils.data.DataLoader`` with ``num_workers`` processes over ``dataset``."""
    import torch.utils.data as tud

    class _Iterable(tud.IterableDataset):
        def __iter__(self):
            info = tud.get_worker_info()
            worker, count = (0, 1) if info is None else (info.id, info.num_workers)
            return dataset.steps(worker, count)

    return tud.DataLoader(_Iterable(), batch_size=None, num_workers=num_workers,
                          prefetch_factor=prefetch_factor if num_workers else None,
                          persistent_workers=num_workers > 0,
                          multiprocessing_context="fork" if num_workers else None)
