"""Fixtures for cluster tests: a real embedded mdata cluster (processes), started and closed here."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from mdata.trainer import Loader


@pytest.fixture(scope="module")
def example_sources_small(example_corpus):
    """The example corpus' text and image sources: what most cluster tests mix. The video source
    is left out (its pool and its decoding cost every module's cluster a process and seconds on
    a 2-core machine); tests of video use :func:`example_sources_with_video`."""
    from mdata.data.example import example_sources

    return [s for s in example_sources(example_corpus) if s.name != "videos"]


@pytest.fixture(scope="module")
def example_sources_with_video(example_corpus):
    """Every source of the example corpus, the video one included."""
    from mdata.data.example import example_sources

    return example_sources(example_corpus)


@pytest.fixture(scope="module")
def mdata_cluster(example_sources_small) -> Iterator:
    """An embedded cluster: Planner scheduler, pools for the example sources, two constructors."""
    from mdata.driver import start_cluster

    logging.getLogger("distributed").setLevel(logging.WARNING)
    with start_cluster(example_sources_small, constructors=2, constructor_threads=1,
                       dashboard_address=":0") as cluster:
        yield cluster


@pytest.fixture
def client(mdata_cluster):
    from distributed import Client

    with Client(mdata_cluster.scheduler_address, set_as_default=False, direct_to_workers=True) as c:
        yield c


def run_loaders(address_or_client, *, job: str, world_size: int, steps: int, ranks=None,
                timeout: float = 60.0, keep=lambda batch: batch, states: dict | None = None,
                checkpoints: dict | None = None, plan=None) -> dict[int, list]:
    """Iterate ``steps`` batches on each rank, one thread per rank; raise the first failure.

    ``states`` receives each rank's ``state_dict()`` at the end; ``checkpoints`` (rank -> a
    ``state_dict()``) restores ranks before they start (with ``plan``, as a new job)."""
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            with Loader(address_or_client, job=job, rank=rank, world_size=world_size, steps=steps,
                        timeout=timeout, plan=plan) as loader:
                if checkpoints is not None:
                    loader.load_state_dict(checkpoints[rank])
                results[rank] = [keep(batch) for batch in loader]
                if states is not None:
                    states[rank] = loader.state_dict()
        except BaseException as exc:  # noqa: BLE001 - re-raised below in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in (ranks if ranks is not None else range(world_size))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 30)
    if errors:
        raise errors[0]
    return results
