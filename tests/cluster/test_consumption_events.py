"""A message's consumption becomes a few Planner events per step and DP group, not two per rank.

On the real scheduler, with a registered job: what several ranks told together
(:func:`scheduler_plugins.consumption.consumption_events`) is one delivery per DP group and one
consumption per step, each carrying its ranks; a resend of the same steps is no news (no
delivery, no step told first), and a rank fed by broadcast has no delivery of its own. The events
are read, not applied: the test checks their shape, the other cluster tests what trainers get.
"""

from __future__ import annotations

import time

import pytest

from mdata.cost import AttentionCost
from mdata.driver import submit_job
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def plan_of(sources, broadcast=None) -> Plan:
    text = [s for s in sources if s.name in ("chat", "code")]
    plan = (Plan(text).mix({"chat": 1.0, "code": 1.0}).cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=4096, global_batch=8)
            .distribute(ClientPlaceTree(dp=2, tp=4)).seed(7).window(3))
    return plan.broadcast_at(broadcast) if broadcast else plan


def told_events(client, job: str, told: list[list[tuple]]) -> list:
    """On the scheduler, once step 0 is balanced: per message of ``told`` (rank, steps, token)
    entries, its events as (kind, step, DP rank or None, ranks) and the steps told first."""
    def run(dask_scheduler=None, job=job, told=told):
        from scheduler_plugins.consumption import Told, consumption_events

        runtime = dask_scheduler.extensions["mdata"].jobs[job]
        if runtime.view.balanced_step < 1:
            return None
        out = []
        for message in told:
            events, firsts = consumption_events(runtime, [Told(r, tuple(s), t) for r, s, t in message])
            out.append(([(type(ev).__name__, ev.step, getattr(ev, "dp_rank", None), list(ev.ranks))
                         for ev in events], [list(f) for f in firsts]))
        return out

    deadline = time.monotonic() + 60
    while (result := client.run_on_scheduler(run)) is None:
        assert time.monotonic() < deadline, "step 0 was never balanced"
        time.sleep(0.05)
    return result


def test_one_message_of_eight_ranks_is_one_delivery_per_group_and_one_consumption(
        client, example_sources_small):
    submit_job(client, plan_of(example_sources_small), job="told-8")
    everyone = [(r, [0], f"lease-{r}") for r in range(8)]
    (events, firsts), (again, refirsts) = told_events(client, "told-8", [everyone, everyone])
    by_group = {dp: ranks for kind, _, dp, ranks in events if kind == "BatchDelivered"}
    consumed = [(step, ranks) for kind, step, _, ranks in events if kind == "RanksConsumed"]
    assert sorted(by_group) == [0, 1] and sorted(r for rs in by_group.values() for r in rs) == list(range(8))
    assert all(len(ranks) == 4 for ranks in by_group.values())  # DP 2 x TP 4
    assert consumed == [(0, list(range(8)))] and len(events) == 3
    assert firsts == [[0]] * 8
    # the same tells resent: no delivery again, no step first; the consumption goes on to the
    # Planner, which takes a repeat as a no-op
    assert again == [("RanksConsumed", 0, None, list(range(8)))] and refirsts == [[]] * 8


def test_ranks_fed_by_broadcast_tell_consumption_without_a_delivery(client, example_sources_small):
    submit_job(client, plan_of(example_sources_small, broadcast="tp"), job="told-tp")
    (events, firsts), = told_events(client, "told-tp", [[(r, [0], f"lease-{r}") for r in range(8)]])
    delivered = sorted(r for kind, _, _, ranks in events if kind == "BatchDelivered" for r in ranks)
    assert delivered == [0, 4]  # TP rank 0 of each DP group receives; the others get it by broadcast
    assert [(k, ranks) for k, _, _, ranks in events if k == "RanksConsumed"] == [("RanksConsumed", list(range(8)))]
