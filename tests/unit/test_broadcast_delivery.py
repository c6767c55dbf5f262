"""Every broadcast axis delivers everything: what the constructor sends the receiving ranks of a DP
group (mdata.mesh.Delivery -> DPBatch.for_rank) covers every planned token, as without broadcast,
and each non-receiving rank can get exactly its own view from its broadcast source."""

from __future__ import annotations

import numpy as np
import pytest
from distributed.protocol import dumps, loads, to_serialize
from hypothesis import given, settings
from hypothesis import strategies as st

import mdata.wire.frames  # noqa: F401  registers the wire format
from mdata.batch import Batch, DPBatch, build_dp_batch
from mdata.errors import BatchError, MeshError
from mdata.mesh import ClientPlaceTree, Delivery
from mdata.sources.chunk import SampleChunk

MESHES = [
    ClientPlaceTree(dp=2, pp=3, cp=2, tp=2),
    ClientPlaceTree(dp=3, pp=1, cp=4, tp=1),
    ClientPlaceTree(dp=2, pp=2, cp=3, tp=2, order="cp-tp-pp-dp"),
    ClientPlaceTree(dp=1, pp=2, cp=1, tp=4),
]


def planned_batch(dp_rank: int, cp: int, seed: int = 0) -> DPBatch:
    """A DP group's real packed batch whose ``input_ids``/``labels`` are replaced by position tags
    (position p holds p, labels hold p + 10**6), so every received token says where it was planned."""
    rng = np.random.default_rng(seed + 17 * dp_rank)
    lengths = rng.integers(1, 30, size=7)
    tokens = [rng.integers(1, 1000, size=n) for n in lengths]
    chunk = SampleChunk.from_samples("web", dp_rank, np.arange(7), tokens)
    micro = np.array([0, 1, 0, 1, 0, 1, 1])
    position = np.array([0, 0, 1, 1, 2, 2, 3])
    ids = np.stack([np.zeros(7), np.full(7, dp_rank), np.arange(7)], 1).astype(np.int64)
    dp = build_dp_batch(4, dp_rank, [chunk], micro, position, lengths, ids, 2,
                        max_tokens=200, cp=cp, pad_to_multiple=8)
    tagged = tuple(
        mb.with_fields(input_ids=np.arange(mb.seq_len, dtype=np.int32),
                       labels=np.arange(mb.seq_len, dtype=np.int32) + 10**6)
        for mb in dp.micro_batches
    )
    return DPBatch(dp.step, dp.dp_rank, dp.cp, tagged, dp.tokens_per_source)


def sent(mesh: ClientPlaceTree, dp: DPBatch, rank: int, axis) -> Batch | None:
    """What the constructor sends ``rank`` (None: nothing, it receives by broadcast)."""
    delivery = mesh.delivery(rank, axis)
    if delivery is None:
        return None
    return dp.for_rank(delivery.cp_rank, receives_tokens=delivery.receives_tokens,
                       receives_labels=delivery.receives_labels)


def covered(mesh: ClientPlaceTree, dp: DPBatch, axis) -> set[tuple[str, int, int]]:
    """``(field, micro-batch, position)`` of every token or label the receivers of ``dp``'s group get."""
    out: set[tuple[str, int, int]] = set()
    for rank in mesh.receivers(dp.dp_rank, axis):
        batch = sent(mesh, dp, rank, axis)
        assert batch is not None, f"receiver {rank} gets nothing under broadcast_at({axis!r})"
        for mb in batch.micro_batches:
            for name in ("input_ids", "labels"):
                if name in mb:
                    offset = 10**6 if name == "labels" else 0
                    out.update((name, mb.index, int(p) - offset) for p in mb[name])
    return out


def same_arrays(a: Batch, b: Batch) -> bool:
    if (a.cp_rank, a.cp, a.receives_tokens, a.receives_labels) != (
            b.cp_rank, b.cp, b.receives_tokens, b.receives_labels):
        return False
    for x, y in zip(a.micro_batches, b.micro_batches, strict=True):
        if x.names != y.names or x.seq_len != y.seq_len:
            return False
        if not np.array_equal(x.sample_ids, y.sample_ids):
            return False
        if not all(np.array_equal(x[n], y[n]) for n in x.names):
            return False
    return True


@pytest.mark.parametrize("mesh", MESHES, ids=lambda m: f"dp{m.dp}pp{m.pp}cp{m.cp}tp{m.tp}-{m.order}")
@pytest.mark.parametrize("axis", ["tp", "cp", "pp"])
def test_receivers_cover_every_planned_token_as_without_broadcast(mesh, axis):
    for d in range(mesh.dp):
        dp = planned_batch(d, mesh.cp)
        everything = {
            (name, mb.index, p)
            for mb in dp.micro_batches for name in ("input_ids", "labels") for p in range(mb.seq_len)
        }
        assert covered(mesh, dp, None) == everything
        assert covered(mesh, dp, axis) == everything, f"dp group {d}"


@pytest.mark.parametrize("mesh", MESHES, ids=lambda m: f"dp{m.dp}pp{m.pp}cp{m.cp}tp{m.tp}-{m.order}")
@pytest.mark.parametrize("axis", ["tp", "cp", "pp"])
def test_every_rank_gets_its_own_view_from_its_broadcast_source(mesh, axis):
    """A TP source holds exactly what its TP group needs; a CP source holds the whole sequence, from
    which each CP rank cuts exactly the slice the constructor would have sent it; a PP source (the
    first stage) holds its CP slice with inputs and labels, so every stage finds its own fields."""
    for d in range(mesh.dp):
        dp = planned_batch(d, mesh.cp, seed=5)
        for rank in mesh.dp_group(d):
            own = sent(mesh, dp, rank, None)
            source = mesh.broadcast_source(rank, axis)
            held = sent(mesh, dp, rank if source is None else source, axis)
            if axis == "tp":
                assert held.cp_rank == mesh.coordinate(rank).cp
                assert same_arrays(held, own), rank
            elif axis == "pp":
                assert held.cp_rank == own.cp_rank and held.receives_tokens and held.receives_labels
                for mine, theirs in zip(own.micro_batches, held.micro_batches, strict=True):
                    assert np.array_equal(mine.sample_ids, theirs.sample_ids), rank
                    assert all(np.array_equal(mine[n], theirs[n]) for n in mine.names), rank
            else:
                assert held.is_whole and held.cp == mesh.cp
                assert same_arrays(held.cp_slice(mesh.coordinate(rank).cp), own), rank


def test_an_unknown_axis_is_refused():
    mesh = MESHES[0]
    for ask in (lambda: mesh.delivery(0, "dp"), lambda: mesh.broadcast_source(0, "dp"),
                lambda: mesh.receivers(0, "dp")):
        with pytest.raises(MeshError, match="broadcast_at='dp'"):
            ask()


def test_delivery_and_broadcast_source_of_single_ranks():
    mesh = ClientPlaceTree(dp=2, pp=2, cp=2, tp=2)  # rank = tp + 2 (cp + 2 (dp + 2 pp))
    assert mesh.delivery(13, None) == Delivery(cp_rank=0, receives_tokens=False, receives_labels=True)
    assert mesh.delivery(3, "tp") is None and mesh.broadcast_source(3, "tp") == 2
    assert mesh.delivery(2, "tp") == Delivery(1, True, False) and mesh.broadcast_source(2, "tp") is None
    assert mesh.delivery(2, "cp") is None and mesh.broadcast_source(2, "cp") == 0
    assert mesh.delivery(9, "cp") == Delivery(None, False, True)
    assert mesh.broadcast_source(15, "cp") == 13 and mesh.broadcast_source(15, None) is None
    assert mesh.delivery(13, "pp") is None and mesh.broadcast_source(13, "pp") == 5
    assert mesh.delivery(5, "pp") == Delivery(0, True, True)
    for axis in (None, "tp", "cp", "pp"):
        for d in range(mesh.dp):
            assert mesh.receivers(d, axis) == tuple(
                r for r in mesh.dp_group(d) if mesh.broadcast_source(r, axis) is None)


@st.composite
def roles_and_batches(draw):
    cp = draw(st.integers(1, 4))
    docs = draw(st.lists(st.integers(1, 40), min_size=0, max_size=8))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    chunk = SampleChunk.from_samples("books", 1, np.arange(len(docs)),
                                     [rng.integers(1, 9000, size=n) for n in docs])
    ids = np.stack([np.zeros(len(docs)), np.ones(len(docs)), np.arange(len(docs))], 1)
    dp = build_dp_batch(2, 0, [chunk], np.zeros(len(docs), np.int64), np.arange(len(docs)), docs,
                        ids.astype(np.int64).reshape(-1, 3), 1, max_tokens=400, cp=cp,
                        pad_to_multiple=draw(st.sampled_from([None, 3, 16])))
    return dp, draw(st.booleans()), draw(st.booleans())


@settings(max_examples=40, deadline=None)
@given(roles_and_batches())
def test_cutting_a_whole_batch_equals_the_constructors_cut(case):
    dp, tokens, labels = case
    whole = dp.for_rank(None, receives_tokens=tokens, receives_labels=labels)
    assert whole.is_whole and whole.cp == dp.cp
    for mb, full in zip(whole.micro_batches, dp.micro_batches, strict=True):
        assert mb.seq_len == full.seq_len
        assert np.array_equal(mb["cu_seqlens"], full["cu_seqlens"])
        assert np.array_equal(mb["cu_seqlens_global"], full["cu_seqlens"])
    for r in range(dp.cp):
        direct = dp.for_rank(r, receives_tokens=tokens, receives_labels=labels)
        assert same_arrays(whole.cp_slice(r), direct)


def test_a_whole_batch_crosses_the_wire_and_only_it_can_be_cut():
    dp = planned_batch(1, cp=2)
    whole = dp.for_rank(None)
    received = loads(dumps(to_serialize(whole)))
    assert received.cp_rank is None and received.cp == 2 and same_arrays(received, whole)
    assert same_arrays(received.cp_slice(1), dp.for_rank(1))
    with pytest.raises(BatchError, match="already CP rank 0's slice"):
        dp.for_rank(0).cp_slice(1)
    with pytest.raises(BatchError, match="cp rank 2 is out of range for cp=2"):
        whole.cp_slice(2)
