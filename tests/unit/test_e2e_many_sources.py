"""The e2e benchmark's ``sources306`` regime: the ``vlm`` sources' real rows cut into 306 sources
(``benchmarks/e2e_many_sources.py``), on synthetic metadata shaped like the e2e corpus (pure, fast)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from benchmarks import e2e_sim
from benchmarks.e2e_baselines import BASELINES
from benchmarks.e2e_data import WEIGHTS
from benchmarks.e2e_many_sources import allocate, many_sources, split_source, zipf_weights
from benchmarks.e2e_model import MODELS
from benchmarks.e2e_scale import REGIMES
from mdata.metadata import SourceMetadata

#: The e2e corpus's shards per source (rows): 190 captions, 384 interleaved, 18 books, 384 code
#: and 384 scenes, as ``e2e_metadata`` reads them.
SHARDS = {"captions": (63, 63, 64), "interleaved": (128,) * 3, "books": (6,) * 3,
          "code": (128,) * 3, "scenes": (128,) * 3}


def _meta(extra: bool = False) -> dict[str, SourceMetadata]:
    """Every row's token count unique across the mix (its identity), patches only for images."""
    rng = np.random.default_rng(7)
    out, first = {}, 1
    for name, shards in {**SHARDS, **({"videos": (5, 7)} if extra else {})}.items():
        toks, pats = [], []
        for n in shards:
            ids = np.arange(first, first + n, dtype=np.int32)
            toks.append(ids * 3 + rng.integers(0, 3, n).astype(np.int32))
            first += n
            image = name in ("captions", "interleaved", "videos")
            pats.append(rng.integers(50, 900, n).astype(np.int32) if image else np.zeros(n, np.int32))
        out[name] = SourceMetadata(name, tuple(toks), tuple(pats))
    return out


def _pieces(meta: dict[str, SourceMetadata], kind: str) -> list[SourceMetadata]:
    return [m for n, m in meta.items() if n.rsplit(".", 1)[0] == kind]


def test_the_regime_is_the_vlm_job_with_its_sources_cut_into_306() -> None:
    s, vlm = REGIMES["sources306"], REGIMES["vlm"]
    assert s.pieces == 306 and vlm.pieces == 0 and s.weights is vlm.weights is WEIGHTS
    for attr in ("model", "tp", "pp", "cp", "max_tokens", "gpus", "node", "micro_batches", "fill"):
        assert getattr(s, attr) == getattr(vlm, attr), attr


def test_pieces_follow_the_sources_rows_306_in_all_at_least_one_each() -> None:
    rows = {k: sum(v) for k, v in SHARDS.items()}
    assert allocate(rows, 306) == {"captions": 43, "interleaved": 87, "books": 4, "code": 86, "scenes": 86}
    assert allocate(rows, 5) == dict.fromkeys(rows, 1)
    assert allocate(rows, 1360) == rows  # one row a piece
    small = allocate({"big": 1000, "tiny": 1}, 10)
    assert small == {"big": 9, "tiny": 1}  # the floor of one is taken from the largest
    for n in (4, 1361):
        with pytest.raises(ValueError):
            allocate(rows, n)


def test_the_split_keeps_every_row_of_every_source_exactly_once_in_order() -> None:
    meta = _meta()
    pieces, cost, weights = many_sources(meta, dict.fromkeys(meta, 0.5), WEIGHTS, 306)
    assert len(pieces) == len(cost) == len(weights) == 306
    assert list(pieces) == list(weights) == list(cost)
    for kind, parent in meta.items():
        mine = _pieces(pieces, kind)
        assert [m.name for m in mine] == [f"{kind}.{k:03d}" for k in range(len(mine))]
        for field in ("num_tokens", "num_patches"):  # the parent's rows, each once, in row order
            assert np.array_equal(np.concatenate([a for m in mine for a in getattr(m, field)]),
                                  np.concatenate(getattr(parent, field))), (kind, field)
        sizes = [int(m.shard_rows.sum()) for m in mine]
        assert max(sizes) - min(sizes) <= 1, kind  # near-equal contiguous ranges
        assert all(m.name == n for n, m in pieces.items())
    all_rows = np.concatenate([a for m in pieces.values() for a in m.num_tokens])
    assert np.unique(all_rows).size == all_rows.size == 1360  # disjoint: no row in two pieces
    assert {int(m.shard_rows.sum()) for m in pieces.values()} == {4, 5}
    assert len(_pieces(pieces, "books")) == 4  # 4 pieces of 4-5 books each


def test_a_piece_across_a_shard_boundary_keeps_a_shard_per_part_and_skipped_rows() -> None:
    tok = (np.arange(5, dtype=np.int32), np.arange(5, 8, dtype=np.int32))
    skipped = (np.array([0, 0, 1, 0, 0], bool), None)
    meta = SourceMetadata("s", tok, tuple(np.zeros_like(t) for t in tok), skipped)
    a, b = split_source(meta, 2)
    assert [t.tolist() for t in a.num_tokens] == [[0, 1, 2, 3]]
    assert [t.tolist() for t in b.num_tokens] == [[4], [5, 6, 7]]
    assert a.skipped[0].tolist() == [False, False, True, False]
    assert b.skipped[0].tolist() == [False] and b.skipped[1] is None


def test_each_source_keeps_its_vlm_weight_split_by_zipf_over_its_pieces() -> None:
    meta = _meta(extra=True)  # a source vlm does not name is left out, not cut
    pieces, cost, weights = many_sources(meta, {**dict.fromkeys(SHARDS, 0.25), "books": 2.0,
                                                "videos": 9.0}, WEIGHTS, 306)
    assert not [n for n in pieces if n.startswith("videos")]
    for kind, total in WEIGHTS.items():
        mine = np.array([weights[m.name] for m in _pieces(pieces, kind)])
        assert mine.sum() == pytest.approx(total), kind
        assert sorted(mine / mine.sum() * np.sum(1.0 / np.arange(1, mine.size + 1)), reverse=True) == \
            pytest.approx(1.0 / np.arange(1, mine.size + 1)), kind  # rank r: share 1 / r
        assert {cost[m.name] for m in _pieces(pieces, kind)} == {2.0 if kind == "books" else 0.25}
    heavy = max(weights[m.name] for m in _pieces(pieces, "interleaved"))
    assert heavy > 20 * min(weights[m.name] for m in _pieces(pieces, "interleaved"))  # a long tail
    # The heaviest piece of each source is not always its first: ranks are shuffled.
    firsts = [int(np.argmax([weights[m.name] for m in _pieces(pieces, k)])) for k in WEIGHTS]
    assert any(f != 0 for f in firsts)


def test_the_split_is_deterministic_and_seeded() -> None:
    meta, cost = _meta(), dict.fromkeys(SHARDS, 1e-3)
    one, two = many_sources(meta, cost, WEIGHTS, 306), many_sources(meta, cost, WEIGHTS, 306)
    assert one[2] == two[2] and one[1] == two[1]
    for n in one[0]:
        assert all(np.array_equal(a, b) for a, b in zip(one[0][n].num_tokens, two[0][n].num_tokens))
    assert not np.array_equal(zipf_weights(1.0, 86, "code", seed=1), zipf_weights(1.0, 86, "code"))
    assert not np.array_equal(zipf_weights(1.0, 86, "code"), zipf_weights(1.0, 86, "scenes"))


def test_the_regime_runs_both_sides_on_the_same_306_sources(monkeypatch) -> None:
    seen: dict[str, object] = {}
    mdata_steps, baseline_steps = e2e_sim._mdata_steps, e2e_sim.baseline_steps

    def planner(setup, meta, *args, **kwargs):
        seen["planner"] = (list(meta), dict(setup.weights))
        return mdata_steps(setup, meta, *args, **kwargs)

    def baselines(meta, weights, **kwargs):
        seen["baselines"] = (list(meta), dict(weights))
        return baseline_steps(meta, weights, **kwargs)

    monkeypatch.setattr(e2e_sim, "_mdata_steps", planner)
    monkeypatch.setattr(e2e_sim, "baseline_steps", baselines)
    setup = replace(REGIMES["sources306"], model=MODELS["llava-ov-0.5b"], gpus=64, tp=2, pp=2, cp=2,
                    max_tokens=8192)
    meta = _meta(extra=True)  # videos: in meta, absent from the weights
    out = e2e_sim.simulate(setup, meta, dict.fromkeys(meta, 1e-3), steps=1, loader_cores=(1.0,))
    names, weights = seen["planner"]
    assert seen["baselines"] == seen["planner"]
    assert len(names) == len(set(names)) == 306 == out["shape"]["sources"] and list(weights) == names
    assert sum(weights.values()) == pytest.approx(sum(WEIGHTS.values()))
    for name in BASELINES:  # equal work (dataloader's budget is samples: its tokens follow its draw)
        assert 0.97 < out["ratio"][name]["tokens_per_step"] < 1.03 or name == "dataloader", name
        assert out["ratio"][name]["ratio"] > 0 and out["cores_sweep"][1.0]["ratio"][name]["ratio"] > 0
    assert out["vs_ideal"] > 0
    # The same job without the cut: five sources, the kinds' weights.
    plain = e2e_sim.simulate(replace(setup, pieces=0), meta, dict.fromkeys(meta, 1e-3), steps=1)
    assert plain["shape"]["sources"] == 5 and seen["planner"][1] == WEIGHTS
