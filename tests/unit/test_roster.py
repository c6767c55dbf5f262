"""The trainer roster: one Loader per rank, and resumes that rewind every rank alike."""

import pytest

from mdata.errors import TrainerError
from mdata.planner.roster import (
    Holder,
    RankTakenError,
    ResumeMismatchError,
    StaleGenerationError,
    TrainerRoster,
)


def holder(name: str, client: str | None = None) -> Holder:
    return Holder(client=client or f"client-{name}", token=f"token-{name}", host="h", pid=1)


def live(*holders: Holder):
    alive = {h.token for h in holders}
    return lambda h: h.token in alive


def test_fresh_job_every_rank_joins_generation_zero_at_the_start():
    roster = TrainerRoster(world_size=2, start_step=0)
    a = roster.attach(0, holder("a"), checkpoint_step=None, is_live=live())
    b = roster.attach(1, holder("b"), checkpoint_step=None, is_live=live())
    assert (a.generation, a.start_step, a.rewind) == (0, 0, False)
    assert (b.generation, b.start_step, b.rewind) == (0, 0, False)


def test_a_second_loader_for_a_live_rank_is_refused_naming_both():
    roster = TrainerRoster(world_size=2, start_step=0)
    first = holder("first")
    roster.attach(0, first, checkpoint_step=None, is_live=live(first))
    with pytest.raises(RankTakenError) as err:
        roster.attach(0, holder("second"), checkpoint_step=None, is_live=live(first))
    assert "token-fi" in str(err.value) and "token-se" in str(err.value)


def test_a_dead_holder_can_be_taken_over_and_the_rank_continues_where_it_was():
    roster = TrainerRoster(world_size=2, start_step=0)
    roster.attach(0, holder("old"), checkpoint_step=None, is_live=live())
    again = roster.attach(0, holder("new"), checkpoint_step=None, is_live=live(), next_step=7)
    assert (again.generation, again.start_step, again.rewind) == (0, 7, False)
    with pytest.raises(RankTakenError):
        roster.check(0, "token-old", 0)
    roster.check(0, "token-new", 0)


def test_resume_on_a_live_job_rewinds_once_and_the_other_ranks_join():
    roster = TrainerRoster(world_size=3, start_step=0)
    for r in range(3):
        roster.attach(r, holder(f"g0-{r}"), checkpoint_step=None, is_live=live())
    first = roster.attach(1, holder("g1-1"), checkpoint_step=60, is_live=live())
    assert (first.generation, first.start_step, first.rewind) == (1, 60, True)
    others = [roster.attach(r, holder(f"g1-{r}"), checkpoint_step=60, is_live=live()) for r in (0, 2)]
    assert [(o.generation, o.start_step, o.rewind) for o in others] == [(1, 60, False)] * 2
    with pytest.raises(StaleGenerationError, match="rewound to step 60"):
        roster.check(0, "token-g1-0", 0)
    roster.check(0, "token-g1-0", 1)


def test_a_rank_bringing_another_step_gets_an_error_naming_ranks_and_steps():
    roster = TrainerRoster(world_size=3, start_step=0)
    for r in range(3):
        roster.attach(r, holder(f"g0-{r}"), checkpoint_step=None, is_live=live())
    roster.attach(0, holder("g1-0"), checkpoint_step=60, is_live=live())
    with pytest.raises(ResumeMismatchError) as err:
        roster.attach(2, holder("g1-2"), checkpoint_step=50, is_live=live())
    assert "step 50" in str(err.value) and "{0: 60}" in str(err.value)


def test_a_rank_restarting_again_starts_a_new_generation():
    roster = TrainerRoster(world_size=2, start_step=0)
    roster.attach(0, holder("a"), checkpoint_step=None, is_live=live())
    roster.attach(0, holder("b"), checkpoint_step=10, is_live=live())
    again = roster.attach(0, holder("c"), checkpoint_step=10, is_live=live())
    assert (again.generation, again.rewind) == (2, True)


def test_a_job_registered_from_a_checkpoint_is_joined_without_a_rewind():
    roster = TrainerRoster(world_size=2, start_step=40)
    att = [roster.attach(r, holder(str(r)), checkpoint_step=40, is_live=live()) for r in range(2)]
    assert [(a.generation, a.start_step, a.rewind) for a in att] == [(0, 40, False)] * 2


def test_closing_or_losing_the_client_frees_the_rank():
    roster = TrainerRoster(world_size=2, start_step=0)
    a, b = holder("a", client="c1"), holder("b", client="c1")
    roster.attach(0, a, checkpoint_step=None, is_live=live(a, b))
    roster.attach(1, b, checkpoint_step=None, is_live=live(a, b))
    roster.detach(0, "token-a")
    assert set(roster.holders()) == {1}
    assert roster.release_client("c1") == [1]
    assert roster.holders() == {}


def test_ranks_outside_the_world_are_refused():
    roster = TrainerRoster(world_size=2, start_step=0)
    with pytest.raises(Exception, match="outside"):
        roster.attach(2, holder("x"), checkpoint_step=None, is_live=live())


def test_a_rewind_is_only_decided_until_committed_so_a_refused_one_changes_nothing():
    """A rank restarts with a checkpoint; building the state from it fails (the runtime never
    commits): the healthy ranks keep their generation and the rank keeps no lease."""
    roster = TrainerRoster(world_size=2, start_step=0)
    healthy = holder("healthy")
    roster.attach(0, healthy, checkpoint_step=None, is_live=live(healthy))
    roster.attach(1, holder("old"), checkpoint_step=None, is_live=live(healthy))
    att = roster.decide(1, holder("bad"), checkpoint_step=6, is_live=live(healthy))
    assert (att.generation, att.start_step, att.rewind) == (1, 6, True)
    assert roster.generation == 0 and roster.start_step == 0
    roster.check(0, "token-healthy", 0)  # no StaleGenerationError: nothing moved
    assert roster.holders()[1].token == "token-old"
    again = roster.attach(1, holder("fixed"), checkpoint_step=None, is_live=live(healthy), next_step=4)
    assert (again.generation, again.start_step, again.rewind) == (0, 4, False)
    roster.check(0, "token-healthy", 0)


def test_a_committed_rewind_moves_every_rank_to_the_new_generation():
    roster = TrainerRoster(world_size=2, start_step=0)
    for r in range(2):
        roster.attach(r, holder(f"g0-{r}"), checkpoint_step=None, is_live=live())
    att = roster.decide(1, holder("g1-1"), checkpoint_step=6, is_live=live())
    roster.commit(att)
    assert (roster.generation, roster.start_step) == (1, 6)
    with pytest.raises(StaleGenerationError):
        roster.check(0, "token-g0-0", 0)
    roster.check(1, "token-g1-1", 1)


def test_a_decision_taken_before_the_roster_moved_is_not_committed():
    roster = TrainerRoster(world_size=2, start_step=0)
    stale = roster.decide(0, holder("a"), checkpoint_step=5, is_live=live())
    roster.rewound_by_driver(8)
    with pytest.raises(TrainerError, match="attach again"):
        roster.commit(stale)
    assert (roster.generation, roster.start_step) == (1, 8) and roster.holders() == {}


def test_ranks_resuming_from_different_steps_all_get_the_mismatch_naming_ranks_and_steps():
    """The README's pattern on a job registered from rank 0's checkpoint (step 4): rank 1 brings
    step 2. Rank 1 is refused, and rank 0, which joined first, hears the same error instead of
    training alone or being bounced to another generation."""
    roster = TrainerRoster(world_size=3, start_step=4)
    roster.attach(0, holder("r0"), checkpoint_step=4, is_live=live())
    roster.attach(2, holder("r2"), checkpoint_step=4, is_live=live())
    with pytest.raises(ResumeMismatchError) as refused:
        roster.attach(1, holder("r1"), checkpoint_step=2, is_live=live())
    message = str(refused.value)
    assert "rank 1" in message and "step 2" in message and "{0: 4, 2: 4}" in message
    for rank in (0, 2):
        with pytest.raises(ResumeMismatchError) as err:
            roster.check(rank, f"token-r{rank}", 0)
        assert str(err.value) == message
    assert roster.generation == 0  # no rewind: nobody bounced to another generation
    with pytest.raises(ResumeMismatchError):  # a rank without a checkpoint cannot join it either
        roster.attach(1, holder("r1b"), checkpoint_step=None, is_live=live())


def test_after_a_mismatch_consistent_checkpoints_start_a_new_generation_everyone_joins():
    roster = TrainerRoster(world_size=2, start_step=4)
    roster.attach(0, holder("r0"), checkpoint_step=4, is_live=live())
    with pytest.raises(ResumeMismatchError):
        roster.attach(1, holder("r1"), checkpoint_step=2, is_live=live())
    first = roster.attach(1, holder("r1b"), checkpoint_step=4, is_live=live())  # not the failed one
    second = roster.attach(0, holder("r0b"), checkpoint_step=4, is_live=live())
    assert [(a.generation, a.start_step, a.rewind) for a in (first, second)] == [(1, 4, True),
                                                                               (1, 4, False)]
    roster.check(0, "token-r0b", 1)
    roster.check(1, "token-r1b", 1)


def test_a_rank_bringing_a_step_to_a_run_without_checkpoints_is_refused_alone():
    """Ranks that started without checkpoints are no resume: a newcomer that brings a step is
    refused, and they keep training."""
    roster = TrainerRoster(world_size=2, start_step=0)
    roster.attach(0, holder("a"), checkpoint_step=None, is_live=live())
    with pytest.raises(ResumeMismatchError, match=r"\{0: None\}"):
        roster.attach(1, holder("b"), checkpoint_step=3, is_live=live())
    roster.check(0, "token-a", 0)


def _passes(roster, rank, token, generation) -> bool:
    try:
        roster.check(rank, token, generation)
    except (TrainerError, RankTakenError, StaleGenerationError, ResumeMismatchError):
        return False
    return True


@pytest.mark.parametrize("asks", [
    [(0, "token-a", 0), (1, "token-b", 0)],
    [(0, "token-a", 0), (1, "token-x", 0)],  # a lease another Loader holds
    [(0, "token-a", 1), (1, "token-b", 0)],  # an older or newer generation
    [(0, "token-a", 0), (2, "token-b", 0)],  # outside the world
    [(0, "token-a", 0), (-1, "token-b", 0)],
    [],
])
def test_holds_all_is_every_check_passing(asks):
    """One pass for a message of many ranks; True exactly when check passes for each."""
    roster = TrainerRoster(world_size=2, start_step=0)
    roster.attach(0, holder("a"), checkpoint_step=None, is_live=live())
    roster.attach(1, holder("b"), checkpoint_step=None, is_live=live())
    ranks, tokens, gens = ([a[i] for a in asks] for i in range(3))
    assert roster.holds_all(ranks, tokens, gens) == all(_passes(roster, *a) for a in asks)


def test_the_roster_version_moves_with_every_change_to_leases_or_generation():
    """Readers that checked leases at one version rely on them while it stays the same."""
    roster = TrainerRoster(world_size=2, start_step=0)
    seen = [roster.version]
    roster.attach(0, holder("a"), checkpoint_step=None, is_live=live())
    seen.append(roster.version)
    roster.check(0, "token-a", 0)  # reads change nothing
    assert roster.version == seen[-1]
    roster.attach(1, holder("b", client="shared"), checkpoint_step=None, is_live=live())
    seen.append(roster.version)
    roster.detach(0, "token-other")  # not the holder: no change
    assert roster.version == seen[-1]
    roster.detach(0, "token-a")
    seen.append(roster.version)
    assert roster.release_client("nobody") == [] and roster.version == seen[-1]
    assert roster.release_client("shared") == [1]
    seen.append(roster.version)
    roster.rewound_by_driver(5)
    seen.append(roster.version)
    assert seen == sorted(set(seen))  # each change moved it
