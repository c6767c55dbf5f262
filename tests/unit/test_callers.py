"""Who may change a job (mdata.planner.callers) and the checks of a rank's requests against its
job (scheduler_plugins.rank_checks): pure, no cluster."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from mdata.errors import CallerRefusedError, RankTakenError, StaleGenerationError
from mdata.planner.callers import JobCallers
from mdata.planner.roster import Holder, TrainerRoster
from mdata.wire.errors import InvalidRequestError
from scheduler_plugins.rank_checks import (
    check_lease, check_metrics, check_received, check_stall, lease_is_current,
)


def test_drivers_and_loaders_may_change_a_job_others_may_not() -> None:
    callers = JobCallers()
    callers.registered("pretrain", "Client-driver")
    callers.registered("pretrain", "")  # a caller without an id is never a driver
    assert callers.drivers("pretrain") == {"Client-driver"}
    callers.check("mdata_close_job", "pretrain", "Client-driver", loaders=[])
    callers.check("mdata_close_job", "pretrain", "Client-trainer", loaders=["Client-trainer"])
    with pytest.raises(CallerRefusedError, match=r"mdata_close_job: job 'pretrain' was not registered "
                                                 r"by client 'Client-notebook'.*submit_job"):
        callers.check("mdata_close_job", "pretrain", "Client-notebook", loaders=["Client-trainer"])
    with pytest.raises(CallerRefusedError, match="names no client"):
        callers.check("mdata_close_job", "pretrain", "", loaders=[""])
    # another job's driver is not this one's
    callers.registered("eval", "Client-notebook")
    with pytest.raises(CallerRefusedError):
        callers.check("mdata_close_job", "pretrain", "Client-notebook", loaders=[])


def test_a_closed_job_forgets_its_drivers() -> None:
    callers = JobCallers()
    callers.registered("pretrain", "Client-old")
    callers.forget("pretrain")
    callers.registered("pretrain", "Client-new")  # a new job under the same name
    with pytest.raises(CallerRefusedError):
        callers.check("mdata_close_job", "pretrain", "Client-old", loaders=[])
    callers.check("mdata_close_job", "pretrain", "Client-new", loaders=[])


def _roster() -> TrainerRoster:
    roster = TrainerRoster(world_size=2, start_step=0)
    roster.attach(0, Holder("Client-a", "tok0"), checkpoint_step=None, is_live=lambda h: True)
    return roster


def test_rank_requests_need_the_lease_of_the_current_generation() -> None:
    roster = _roster()
    with pytest.raises(InvalidRequestError, match=r"mdata_ack: rank 0: the request carries no lease token"):
        check_lease("mdata_ack", 0, "", roster, 0)
    with pytest.raises(InvalidRequestError, match="no lease token"):
        check_lease("mdata_ack", 0, "")  # without the roster: the token's presence only
    check_lease("mdata_ack", 0, "tok0", roster, 0)
    with pytest.raises(RankTakenError):
        check_lease("mdata_ack", 0, "forged", roster, 0)
    with pytest.raises(StaleGenerationError):
        check_lease("mdata_ack", 0, "tok0", roster, 3)
    req = SimpleNamespace(rank=0, token="tok0", generation=0)
    assert lease_is_current(roster, req)
    assert not lease_is_current(roster, SimpleNamespace(rank=0, token="tok0", generation=1))
    assert not lease_is_current(roster, SimpleNamespace(rank=1, token="tok0", generation=0))


def test_steps_a_rank_received_must_be_balanced() -> None:
    view = SimpleNamespace(balanced_step=4)
    assert check_received("mdata_ack", view, 1, 3) == 3
    with pytest.raises(InvalidRequestError, match=r"mdata_ack: rank 1: step 4 is not balanced yet "
                                                  r"\(steps up to 3 are\)"):
        check_received("mdata_ack", view, 1, 4)
    with pytest.raises(InvalidRequestError, match=r"delivered 0 is not balanced yet \(no step is\)"):
        check_received("mdata_batch_location", SimpleNamespace(balanced_step=0), 0, 0, "delivered")


def test_metrics_and_stalls_must_be_finite() -> None:
    check_metrics("mdata_report_metrics", 0, 1, {"loss/code": 2.5, "loss/chat": 0.0})
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(InvalidRequestError, match=r"rank 0, step 1: metrics \['loss/chat'\] "
                                                      r"are not finite"):
            check_metrics("mdata_report_metrics", 0, 1, {"loss/code": 2.5, "loss/chat": bad})
    assert check_stall("mdata_ack", 0, -1.0) == -1.0  # not told
    assert check_stall("mdata_ack", 0, 12.5) == 12.5
    for bad in (math.nan, math.inf, -2.0):
        with pytest.raises(InvalidRequestError, match="stalled_s"):
            check_stall("mdata_ack", 0, bad)
