"""ClientPlaceTree: rank <-> coordinate mapping, DP groups, roles, receivers, validation."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mdata.errors import MeshError
from mdata.mesh import ClientPlaceTree, MeshCoordinate


def test_megatron_default_order_tp_fastest_then_cp_dp_pp():
    mesh = ClientPlaceTree(dp=2, pp=2, cp=2, tp=2)
    assert mesh.world_size == 16
    assert mesh.coordinate(0) == MeshCoordinate(dp=0, pp=0, cp=0, tp=0)
    assert mesh.coordinate(1) == MeshCoordinate(dp=0, pp=0, cp=0, tp=1)
    assert mesh.coordinate(2) == MeshCoordinate(dp=0, pp=0, cp=1, tp=0)
    assert mesh.coordinate(4) == MeshCoordinate(dp=1, pp=0, cp=0, tp=0)
    assert mesh.coordinate(8) == MeshCoordinate(dp=0, pp=1, cp=0, tp=0)
    assert mesh.coordinate(15) == MeshCoordinate(dp=1, pp=1, cp=1, tp=1)
    assert mesh.rank((1, 1, 0, 1)) == 13


def test_custom_order_changes_strides():
    mesh = ClientPlaceTree(dp=3, pp=1, cp=1, tp=2, order="dp-tp-cp-pp")
    assert [mesh.coordinate(r).dp for r in range(6)] == [0, 1, 2, 0, 1, 2]
    assert [mesh.coordinate(r).tp for r in range(6)] == [0, 0, 0, 1, 1, 1]
    assert mesh.dp_group(1) == (1, 4)


@pytest.mark.parametrize(
    "shape",
    [dict(dp=256, pp=1, cp=4, tp=4), dict(dp=32, pp=4, cp=4, tp=8), dict(dp=64, pp=8, cp=4, tp=8)],
    ids=["4096-dp256-cp4-tp4", "4096-pp4", "16384-pp8"],
)
def test_mapping_is_a_bijection_at_scale(shape):
    mesh = ClientPlaceTree(**shape)
    coords = mesh.coordinates()
    ranks = mesh.ranks(coords.dp, coords.pp, coords.cp, coords.tp)
    assert np.array_equal(ranks, np.arange(mesh.world_size))
    packed = ((coords.dp * mesh.pp + coords.pp) * mesh.cp + coords.cp) * mesh.tp + coords.tp
    assert np.unique(packed).size == mesh.world_size
    # scalar and vectorised forms agree on a sample of ranks
    for r in (0, 1, mesh.world_size // 3, mesh.world_size - 1):
        c = mesh.coordinate(r)
        assert c == MeshCoordinate(
            int(coords.dp[r]), int(coords.pp[r]), int(coords.cp[r]), int(coords.tp[r])
        )
        assert mesh.rank(c) == r


def test_dp_groups_partition_the_world_at_4096():
    mesh = ClientPlaceTree(dp=128, pp=2, cp=4, tp=4)
    groups = [mesh.dp_group(d) for d in range(mesh.dp)]
    assert all(len(g) == mesh.pp * mesh.cp * mesh.tp for g in groups)
    assert sorted(r for g in groups for r in g) == list(range(4096))
    coords = mesh.coordinates()
    for d in (0, 77, 127):
        assert set(np.flatnonzero(coords.dp == d).tolist()) == set(groups[d])


@given(
    dp=st.integers(1, 6), pp=st.integers(1, 4), cp=st.integers(1, 4), tp=st.integers(1, 4),
    order=st.permutations(["dp", "pp", "cp", "tp"]),
)
@settings(max_examples=60, deadline=None)
def test_roundtrip_any_shape_and_order(dp, pp, cp, tp, order):
    mesh = ClientPlaceTree(dp, pp, cp, tp, order="-".join(order))
    seen = {mesh.coordinate(r) for r in range(mesh.world_size)}
    assert len(seen) == mesh.world_size
    assert all(mesh.rank(mesh.coordinate(r)) == r for r in range(mesh.world_size))
    # the first axis named in the order varies fastest
    fastest = order[0]
    if getattr(mesh, fastest) > 1:
        assert getattr(mesh.coordinate(1), fastest) == 1


def test_roles_by_pipeline_stage():
    mesh = ClientPlaceTree(dp=2, pp=4, cp=2, tp=1)
    stages = {}
    for r in range(mesh.world_size):
        role = mesh.role(r)
        stages[role.pp_stage] = (role.receives_tokens, role.receives_labels, role.metadata_only)
        assert role.cp_size == 2 and role.cp_rank == mesh.coordinate(r).cp
    assert stages == {
        0: (True, False, False),
        1: (False, False, True),
        2: (False, False, True),
        3: (False, True, False),
    }


def test_single_stage_receives_tokens_and_labels():
    role = ClientPlaceTree(dp=4).role(3)
    assert (role.receives_tokens, role.receives_labels, role.metadata_only) == (True, True, False)


def test_broadcast_sources_and_receivers():
    mesh = ClientPlaceTree(dp=2, pp=2, cp=2, tp=2)
    assert mesh.receivers(0) == mesh.dp_group(0) == (0, 1, 2, 3, 8, 9, 10, 11)
    assert mesh.receivers(0, broadcast_at="tp") == (0, 2, 8, 10)
    assert mesh.receivers(1, broadcast_at="cp") == (4, 5, 12, 13)
    assert mesh.role(1).is_broadcast_source("tp") is False
    assert mesh.role(2).is_broadcast_source("tp") is True
    assert mesh.role(1).is_broadcast_source(None) is True
    for d in range(mesh.dp):
        expected = tuple(r for r in mesh.dp_group(d) if mesh.role(r).is_broadcast_source("tp"))
        assert mesh.receivers(d, "tp") == expected
    with pytest.raises(MeshError, match="broadcast_at='dp'"):
        mesh.receivers(0, broadcast_at="dp")


def test_from_world_size_infers_dp():
    mesh = ClientPlaceTree.from_world_size(4096, pp=2, cp=4, tp=4)
    assert (mesh.dp, mesh.pp, mesh.cp, mesh.tp) == (128, 2, 4, 4)
    with pytest.raises(MeshError, match="world size 100 is not divisible by pp\\*cp\\*tp = 1\\*1\\*8"):
        ClientPlaceTree.from_world_size(100, tp=8)


def test_validate_world_size_message():
    mesh = ClientPlaceTree(dp=4, pp=2, cp=1, tp=8)
    mesh.validate_world_size(64)
    with pytest.raises(MeshError, match=r"mesh dp=4 pp=2 cp=1 tp=8 needs world size 64, got 60"):
        mesh.validate_world_size(60)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(dp=0), "mesh dp must be >= 1, got 0"),
        (dict(dp=2, tp=2.0), "mesh tp must be an int >= 1, got 2.0"),
        (dict(dp=True), "mesh dp must be an int"),
        (dict(dp=2, order="tp-cp-dp"), "must name each of dp, pp, cp, tp exactly once"),
        (dict(dp=2, order="tp-tp-dp-pp"), "must name each of dp, pp, cp, tp exactly once"),
    ],
)
def test_invalid_shapes_raise_mesh_error(kwargs, message):
    with pytest.raises(MeshError, match=message):
        ClientPlaceTree(**kwargs)


def test_out_of_range_rank_and_coordinate():
    mesh = ClientPlaceTree(dp=2, tp=2)
    with pytest.raises(MeshError, match="rank 4 is outside the mesh"):
        mesh.coordinate(4)
    with pytest.raises(MeshError, match="coordinate tp=2 is outside the mesh"):
        mesh.rank(MeshCoordinate(0, 0, 0, 2))
    with pytest.raises(MeshError, match="dp rank 2 is outside 0..1"):
        mesh.dp_group(2)
    with pytest.raises(MeshError, match="ranks must be integers in 0..3"):
        mesh.coordinates(np.array([0, 5]))


def test_value_semantics():
    a = ClientPlaceTree(dp=8, tp=4)
    b = pickle.loads(pickle.dumps(a))
    assert a == b and hash(a) == hash(b)
    assert b.coordinate(5) == a.coordinate(5)
    assert a != ClientPlaceTree(dp=8, tp=4, order="cp-tp-dp-pp")
    with pytest.raises(AttributeError):
        a.dp = 4  # type: ignore[misc]
