"""Elastic resume on a live cluster: a checkpoint of a DP 4 job resumes as DP 2 and as DP 8 (new
jobs, same cluster) with the same samples in every step as the uninterrupted DP 4 run, and with
half the global batch continuing every source's order; a mixture
change is refused unless allowed, and then exact from the first step without repeating a sample;
shards appended to a source are refused unless accepted, and then read after the known ones.
What trainers received is compared, never lineage alone."""

from __future__ import annotations

import shutil
import threading
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import run_loaders
from mdata.driver import submit_job
from mdata.errors import CheckpointError
from mdata.mixing import ExactApportioner
from mdata.trainer import Loader
from test_failures import plan_for
from test_recovery import close

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

TEXT = ("chat", "scenes", "code")  # epochs do not wrap within these few steps
BATCH, BEFORE, AFTER = 24, 4, 5


def ids(batch) -> tuple[int, list[tuple[int, int, int]]]:
    return batch["step"], [tuple(x) for x in batch["sample_ids"].tolist()]


def per_step(received: dict[int, list]) -> dict[int, list]:
    """Every sample id of each step over all ranks, sorted: the step's global set."""
    out: dict[int, list] = {}
    for batches in received.values():
        for step, samples in batches:
            out.setdefault(step, []).extend(samples)
    return {s: sorted(v) for s, v in sorted(out.items())}


def resume_loaders(client, *, job: str, plan, world_size: int, steps: int, states: dict,
                   **options) -> dict[int, list]:
    """Every rank of a new job restores the DP 4 checkpoint (rank r brings rank r % 4's state)."""
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            with Loader(client, job=job, plan=plan, rank=rank, world_size=world_size, steps=steps,
                        timeout=60, checkpoint=states[rank % len(states)], **options) as loader:
                results[rank] = [ids(batch) for batch in loader]
                loader.mark_consumed()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    if errors:
        raise errors[0]
    return results


@pytest.fixture
def text_sources(example_sources_small):
    return [s for s in example_sources_small if s.name in TEXT]


@pytest.fixture
def dp4_run(client, text_sources):
    """The uninterrupted DP 4 run, and the states of a DP 4 run stopped after step BEFORE-1."""
    plan = plan_for(text_sources, dp=4, global_batch=BATCH)
    submit_job(client, plan, job="elastic-reference")
    reference = run_loaders(client, job="elastic-reference", world_size=4, steps=BEFORE + AFTER,
                            keep=ids)
    submit_job(client, plan, job="elastic-dp4")
    states: dict[int, dict] = {}
    run_loaders(client, job="elastic-dp4", world_size=4, steps=BEFORE, keep=ids, states=states)
    yield plan, per_step(reference), states
    close(client, "elastic-reference", "elastic-dp4")


@pytest.mark.parametrize("dp", [2, 8])
def test_a_dp4_checkpoint_resumes_as_another_dp_with_the_same_samples_per_step(client, text_sources,
                                                                               dp4_run, dp):
    plan, reference, states = dp4_run
    assert all(s["next_step"] == BEFORE for s in states.values())
    listings = states[0]["checkpoint"]["listings"]  # the stored checkpoint names every shard
    assert set(listings) == set(TEXT) and all(
        name.endswith(".parquet") and "/" not in name for name, _ in listings["code"])
    job = f"elastic-dp{dp}-resumed"
    resumed = resume_loaders(client, job=job, plan=plan_for(text_sources, dp=dp, global_batch=BATCH),
                             world_size=dp, steps=AFTER, states=states)
    assert sorted(resumed) == list(range(dp))
    got = per_step(resumed)
    assert list(got) == list(range(BEFORE, BEFORE + AFTER))
    assert got == {s: reference[s] for s in got}
    assert all(len(v) == BATCH for v in got.values())
    close(client, job)


def test_a_mixture_change_is_refused_unless_allowed_then_exact_and_repeats_nothing(
        client, text_sources, dp4_run):
    plan, reference, states = dp4_run
    weights = {"chat": 1.0, "scenes": 3.0, "code": 2.0}
    changed = plan_for(text_sources, dp=2, global_batch=BATCH).mix(weights)
    with pytest.raises(CheckpointError, match="allow_mixture_change=True"):
        resume_loaders(client, job="elastic-mix-refused", plan=changed, world_size=2, steps=1,
                       states=states)
    with pytest.raises(CheckpointError, match=r"seed was 3, is now 4"):
        resume_loaders(client, job="elastic-seed", plan=changed.seed(4), world_size=2, steps=1,
                       states=states, allow_mixture_change=True)
    resumed = resume_loaders(client, job="elastic-mix", plan=changed, world_size=2, steps=AFTER,
                             states=states, allow_mixture_change=True)
    got = per_step(resumed)
    names = changed.source_names
    fresh = ExactApportioner(len(names), BATCH)  # the carries restart: exact from the first step
    for step, samples in got.items():
        counts = Counter(src for src, _, _ in samples)
        assert [counts[i] for i in range(len(names))] == fresh.counts(
            changed.mixture.weights_vector(step, names)).tolist()
    before = [x for s in range(BEFORE) for x in reference[s]]
    after = [x for samples in got.values() for x in samples]
    assert len(set(before + after)) == len(before) + len(after)  # nothing repeated
    close(client, "elastic-mix-refused", "elastic-seed", "elastic-mix")


def test_appended_shards_are_refused_unless_accepted_then_read_after_the_known_ones(
        client, text_sources, tmp_path):
    """The live loaders listed the source when it had one shard; the resume that accepts a second
    one reaches it within its steps, so the loaders must list again (the load task carries its
    job's listing digest) and the trainers receive the appended shard's rows."""
    code = next(s for s in text_sources if s.name == "code")
    folder = tmp_path / "code"
    folder.mkdir()
    known = sorted(Path(code.url.rsplit("/", 1)[0]).glob("*.parquet"))[0]
    shutil.copy(known, folder / known.name)
    rows = pq.read_metadata(known).num_rows
    source = replace(code, url=str(folder / "*.parquet"))
    batch, before, after = 32, 3, 3  # the known epoch ends inside the first step after the resume
    assert batch * before < rows < batch * (before + after) - batch
    plan = plan_for([source], dp=2, global_batch=batch)
    submit_job(client, plan, job="elastic-grow")
    states: dict[int, dict] = {}
    first = run_loaders(client, job="elastic-grow", world_size=2, steps=before, keep=ids,
                        states=states)
    shutil.copy(known, folder / "part-99999.parquet")  # sorts after every known shard
    with pytest.raises(CheckpointError, match=r"1 shards were appended after its 1 "
                                              r"shards \('part-99999.parquet'"):
        resume_loaders(client, job="elastic-grown-refused", plan=plan, world_size=2, steps=1,
                       states=states)
    resumed = resume_loaders(client, job="elastic-grown", plan=plan, world_size=2, steps=after,
                             states=states, accept_appended_shards=True)
    seen = [x for samples in per_step(first).values() for x in samples]
    got = per_step(resumed)
    assert list(got) == list(range(before, before + after))
    assert all(len(v) == batch for v in got.values())
    taken = [x for samples in got.values() for x in samples]
    assert not set(seen) & set(taken) and len(set(taken)) == len(taken)
    # the known epoch continues first: every row of the known shard exactly once over both runs
    assert sorted(r for _, shard, r in seen + taken if shard == 0) == list(range(rows))
    appended = [r for _, shard, r in taken if shard == 1]
    assert len(appended) == batch * (before + after) - rows  # the trainers read the new shard
    assert all(0 <= r < rows for r in appended)
    close(client, "elastic-grow", "elastic-grown-refused", "elastic-grown")


def test_a_dp4_checkpoint_resumes_with_another_global_batch_continuing_every_source(
        client, text_sources, dp4_run):
    """Half the global batch on DP 2: each source's order continues from its cursor, so the steps
    after the resume hold, together, exactly the samples the uninterrupted run took after the
    checkpoint (equal weights divide both batches evenly), and none taken before it."""
    plan, reference, states = dp4_run
    job = "elastic-half-batch"
    half = BATCH // 2
    resumed = resume_loaders(client, job=job, plan=plan_for(text_sources, dp=2, global_batch=half),
                             world_size=2, steps=2 * AFTER, states=states)
    got = per_step(resumed)
    assert list(got) == list(range(BEFORE, BEFORE + 2 * AFTER))
    assert all(len(v) == half for v in got.values())
    taken = [s for samples in got.values() for s in samples]
    assert len(taken) == len(set(taken)), "a sample repeated after the resume"
    before = {s for step in range(BEFORE) for s in reference[step]}
    after = {s for step in range(BEFORE, BEFORE + AFTER) for s in reference[step]}
    assert not before & set(taken), "a sample of the steps before the checkpoint came again"
    assert set(taken) == after, "a source's order did not continue from its cursor"
    close(client, job)
