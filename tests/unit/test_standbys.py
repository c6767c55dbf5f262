"""Warm standby loaders (mdata.pools.standbys): who is promoted when a loader dies, who becomes the
standby when a worker returns, and which standbys a new job warms. Pure: no cluster."""

from __future__ import annotations

import pytest

from mdata.driver import PoolSpec
from mdata.errors import PlanError
from mdata.pools.standbys import Role, RoleChange, StandbyBook, Warm, role_of

TEXT = {"pool_chat": 2, "pool_code": 2}
TEXT_STANDBY = {"standby_chat": 2, "standby_code": 2}


def book_with(*workers: tuple[str, dict]) -> StandbyBook:
    book = StandbyBook()
    for address, resources in workers:
        book.added(address, resources)
    return book


def test_resources_say_the_role_and_the_sources():
    assert role_of(TEXT) == (Role.LOADER, {"chat": 2.0, "code": 2.0})
    assert role_of(TEXT_STANDBY) == (Role.STANDBY, {"chat": 2.0, "code": 2.0})
    assert role_of({"mdata_constructor": 2}) is None
    assert role_of({"pool_chat": 0, "standby_chat": 1}) == (Role.STANDBY, {"chat": 1.0})
    assert role_of({"pool_chat": 1, "standby_chat": 1})[0] is Role.LOADER  # its loads run there


def test_a_new_standby_is_warmed_and_a_new_loader_just_loads():
    book = StandbyBook()
    assert book.added("L", TEXT) == []
    assert book.added("S", TEXT_STANDBY) == [Warm("S", ("chat", "code"))]
    assert book.added("C", {"mdata_constructor": 1}) == []
    assert book.loaders() == ["L"] and book.standbys() == ["S"] and book.role("C") is None


def test_a_lost_loader_is_replaced_by_its_pools_standby_which_gets_the_pool_resources():
    book = book_with(("L", TEXT), ("S", TEXT_STANDBY))
    (change,) = book.removed("L")
    assert change == RoleChange("S", Role.LOADER, {"pool_chat": 2.0, "pool_code": 2.0},
                                ("standby_chat", "standby_code"), replaces="L")
    assert book.loaders("chat") == ["S"] and book.standbys() == []


def test_the_returning_loader_pays_the_debt_by_becoming_the_standby():
    book = book_with(("L", TEXT), ("S", TEXT_STANDBY))
    book.removed("L")
    decisions = book.added("L2", TEXT)  # the nanny restarted it (a new address)
    assert decisions == [RoleChange("L2", Role.STANDBY, {"standby_chat": 2.0, "standby_code": 2.0},
                                    ("pool_chat", "pool_code")),
                         Warm("L2", ("chat", "code"))]
    assert book.loaders() == ["S"] and book.standbys() == ["L2"]
    assert book.snapshot()["owed"] == {}
    # the debt is paid once: a pool scaled up later gets a loader
    assert book.added("L3", TEXT) == [] and book.loaders() == ["S", "L3"]


def test_a_retired_loader_or_a_lost_standby_promotes_nobody():
    book = book_with(("L1", TEXT), ("L2", TEXT), ("S", TEXT_STANDBY))
    assert book.removed("L2", expected=True) == []  # a pool scaled down on purpose
    assert book.removed("S") == []
    assert book.removed("L1") == []  # no standby left: the pool waits for its restart
    assert book.removed("unknown") == []


def test_the_standby_chosen_covers_the_lost_sources_then_fits_best_then_is_warm_then_waited_longest():
    book = book_with(("L", {"pool_chat": 1}), ("wide", {"standby_chat": 1, "standby_code": 1}),
                     ("cold", {"standby_chat": 1}), ("warm", {"standby_chat": 1}),
                     ("other", {"standby_code": 1}))
    book.warmed("warm", ["chat"])
    assert book.removed("L")[0].address == "warm"
    book2 = book_with(("L", {"pool_chat": 1}), ("wide", {"standby_chat": 1, "standby_code": 1}),
                      ("first", {"standby_chat": 1}), ("second", {"standby_chat": 1}))
    assert book2.removed("L")[0].address == "first"
    book3 = book_with(("L", TEXT), ("part", {"standby_chat": 2}))
    assert book3.removed("L") == []  # it would leave 'code' without a loader


def test_a_returning_loader_stays_a_loader_while_it_is_its_sources_only_one():
    book = book_with(("L", TEXT), ("S", TEXT_STANDBY))
    book.removed("L")  # S is promoted
    book.removed("S")  # and dies too: no standby left, nobody loads
    assert book.added("L2", TEXT) == []  # the first to come back must load
    assert book.loaders() == ["L2"]
    # the promoted standby comes back as a standby: the pool's shape is whole again
    assert book.added("S2", TEXT_STANDBY) == [Warm("S2", ("chat", "code"))]
    assert book.snapshot()["owed"] == {}


def test_a_standby_joining_a_pool_that_lost_every_loader_loads_at_once():
    book = book_with(("L", TEXT))
    book.removed("L")  # no standby: the pool has no loader
    (change,) = book.added("S", TEXT_STANDBY)
    assert change.role is Role.LOADER and change.address == "S"
    # and the loader coming back becomes the standby, as after a promotion
    assert book.added("L2", TEXT)[0] == RoleChange(
        "L2", Role.STANDBY, {"standby_chat": 2.0, "standby_code": 2.0}, ("pool_chat", "pool_code"))


def test_standbys_starting_before_any_loader_stay_standbys():
    book = StandbyBook()
    assert book.added("S", TEXT_STANDBY) == [Warm("S", ("chat", "code"))]
    assert book.added("L", TEXT) == []
    assert book.role("S") is Role.STANDBY and book.role("L") is Role.LOADER


def test_a_job_warms_the_standbys_of_its_sources_only():
    book = book_with(("S1", TEXT_STANDBY), ("S2", {"standby_scenes": 1}), ("L", TEXT))
    assert book.warm_for(["chat", "captions"]) == [Warm("S1", ("chat",))]
    book.warmed("S1", ["chat", "nope"])
    assert book.snapshot()["workers"]["S1"]["warm"] == ["chat"]


def test_a_worker_registering_again_is_taken_afresh():
    book = book_with(("S", TEXT_STANDBY))
    assert book.added("S", TEXT) == []
    assert book.role("S") is Role.LOADER and book.standbys() == []


def test_pool_specs_carry_standbys_and_their_resources():
    pool = PoolSpec("text", ("chat", "code"), workers=1, threads=2, standbys=1)
    assert pool.standby_resources == {"standby_chat": 2, "standby_code": 2}
    assert pool.standby_count() == 1
    assert PoolSpec("text", ("chat",)).standby_count() == 0  # mdata.cluster.standbys
    import dask

    with dask.config.set({"mdata.cluster.standbys": 2}):
        assert PoolSpec("text", ("chat",)).standby_count() == 2
    with pytest.raises(PlanError, match="standbys must be an int >= 0"):
        PoolSpec("text", ("chat",), standbys=-1)


# -- a promotion that fails (the standby hung, refused or died) is rolled back ------------------------
def test_a_failed_promotion_is_rolled_back_and_the_restarted_loader_stays_a_loader():
    book = book_with(("L", TEXT), ("S", TEXT_STANDBY))
    book.removed("L")  # S is being promoted
    assert book.promotion_failed("S") == []  # no other standby: nobody else to promote
    assert book.role("S") is Role.STANDBY and book.snapshot()["owed"] == {}
    assert book.added("L2", TEXT) == []  # the restart owes nothing: it stays the loader
    assert book.loaders("chat") == ["L2"] and book.standbys() == ["S"]


def test_a_loader_demoted_while_the_promotion_was_pending_is_promoted_back():
    book = book_with(("L", TEXT), ("S", TEXT_STANDBY))
    book.removed("L")
    (demote, _) = book.added("L2", TEXT)  # the book believed S a loader: L2 paid the debt
    assert demote.role is Role.STANDBY and book.loaders() == ["S"]
    (change,) = book.promotion_failed("S")
    assert change == RoleChange("L2", Role.LOADER, {"pool_chat": 2.0, "pool_code": 2.0},
                                ("standby_chat", "standby_code"), replaces="L")
    book.promoted("L2")
    assert book.loaders() == ["L2"] and book.standbys() == ["S"]
    assert book.snapshot()["owed"] == {}  # the shape it was deployed with: 1 loader, 1 standby
    assert book.promotion_failed("L2") == []  # confirmed: nothing to roll back


def test_another_standby_steps_in_when_the_first_one_fails():
    book = book_with(("L", TEXT), ("S1", TEXT_STANDBY), ("S2", TEXT_STANDBY))
    (first,) = book.removed("L")
    assert first.address == "S1"
    (second,) = book.promotion_failed("S1")
    assert second.address == "S2" and second.replaces == "L"
    assert book.snapshot()["owed"] == {"chat,code": 1}  # the restarted loader will be the standby
    assert book.standbys() == ["S1"]


def test_a_standby_that_dies_being_promoted_counts_as_a_failed_promotion():
    book = book_with(("L", TEXT), ("S1", TEXT_STANDBY), ("S2", TEXT_STANDBY))
    book.removed("L")
    (change,) = book.removed("S1")  # killed while the Planner promoted it
    assert change.address == "S2" and change.role is Role.LOADER
    assert book.snapshot()["owed"] == {"chat,code": 1}
    assert book.promotion_failed("S1") == []  # the keeper's own failure, later: already handled
    assert book.added("L2", TEXT)[0].role is Role.STANDBY  # pays the one debt
    assert book.loaders() == ["S2"] and sorted(book.standbys()) == ["L2"]


def test_a_standby_that_fails_to_step_into_an_empty_pool_is_rolled_back_too():
    book = book_with(("L", TEXT))
    book.removed("L")  # no standby: nobody promoted, the pool has no loader
    (change,) = book.added("S", TEXT_STANDBY)  # a standby joins: it loads at once
    assert change.role is Role.LOADER and change.replaces is None
    assert book.promotion_failed("S") == []
    assert book.role("S") is Role.STANDBY and book.snapshot()["owed"] == {}
    assert book.added("L2", TEXT) == []  # the restart is the loader, not a standby
    assert book.loaders() == ["L2"]
