"""What losing a loader costs the trainers, with and without a warm standby.

* ``reliability.loader_kill_stall_s.standby`` / ``.no_standby``: a text pool of one loader (and
  one warm standby, or none) feeds two trainer ranks that each spend ``step_s`` per step on a
  stand-in for compute and meet every step. Before step ``kill_at`` the loader is killed with
  SIGKILL while it holds chunks the next steps need. The stall is the extra time the ranks then
  spend blocked on their next batch, over the rest of the run, compared with an uninterrupted run
  of the same plan just before, on the same cluster (the slower rank counts). The two
  configurations run on two clusters side by side and take turns, so both see the same load. Median of ``runs`` kills. Each
  also reports ``reload_s`` (from the kill until every chunk the loader held is in memory again,
  or released), and ``samples_lost`` and ``samples_repeated`` (sample ids and token hashes
  against the uninterrupted run, over every run): both must be 0.

Without a standby the Dask nanny restarts the dead loader and the chunks it held are loaded again
in that cold process (new interpreter, imports, listing, footers, tokenizer); with one, the
Planner promotes the standby, whose process already holds the sources open (mdata.pools.standbys).
"""

from __future__ import annotations

import os
import signal
import statistics
import threading
import time
from collections import Counter
from contextlib import ExitStack
from typing import Any

from benchmarks.lockstep import drive_in_lockstep, token_hash

__all__ = ["loader_kill_stall"]


def loader_kill_stall(*, runs: int = 3, steps: int = 12, step_s: float = 0.5, kill_at: int = 4,
                      corpus=None) -> dict[str, dict[str, Any]]:
    """Per configuration (``standby``, ``no_standby``): the median stall in seconds over ``runs``
    loader kills, every run's stall, the step time, samples lost and repeated (summed)."""
    import logging

    import dask
    import distributed  # noqa: F401  its configuration defaults, before dask.config.set below

    from mdata.data.example import example_sources
    from mdata.driver import PoolSpec, start_cluster, submit_job
    from mdata.sources import TokenizeText

    if corpus is None:
        from benchmarks.workload import corpus_dir

        corpus = corpus_dir()
    sources = [s for s in example_sources(corpus) if isinstance(s.transform, TokenizeText)][:3]
    plan = _text_plan(sources)
    logging.getLogger("distributed").setLevel(logging.ERROR)
    configs = {"standby": 1, "no_standby": 0}
    stalls: dict[str, list] = {n: [] for n in configs}
    worst: dict[str, list] = {n: [] for n in configs}
    reloads: dict[str, list] = {n: [] for n in configs}
    lost = dict.fromkeys(configs, 0)
    repeated = dict.fromkeys(configs, 0)
    # SpecCluster closes a nanny whose worker is missing from the scheduler for this long after a
    # removal: with kills a few seconds apart, it would close one restarting after the next
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "1 hour"}), ExitStack() as stack:
        clients = {}
        for name, standbys in configs.items():
            pools = [PoolSpec("text", tuple(s.name for s in sources), workers=1, threads=2,
                              standbys=standbys)]
            cluster = stack.enter_context(start_cluster(
                sources, pools=pools, constructors=1, constructor_threads=2, dashboard_address=None,
                autoscale=False))
            clients[name] = stack.enter_context(cluster.client())
            clients[name].wait_for_workers(2 + standbys, timeout=120)
        # the configurations take turns, so both see the same load on a shared machine; each
        # kill is compared with an uninterrupted run just before it on the same cluster
        for i in range(runs):
            for name, standbys in configs.items():
                client = clients[name]
                submit_job(client, plan, job=f"reference-{i}")
                reference = _drive_in_lockstep(client, f"reference-{i}", steps, step_s)
                client.sync(client.scheduler.mdata_close_job, job=f"reference-{i}", client=client.id)
                job = f"kill-{i}"
                submit_job(client, plan, job=job)
                _wait_for_standbys(client, standbys)
                got = _drive_in_lockstep(client, job, steps, step_s, kill_at=kill_at)
                stalls[name].append(_stall(got, reference, kill_at))
                reloads[name].append(got["killed"].get("reload_s", float("nan")))
                worst[name].append(max(max(w for *_, w in got["ranks"][r][kill_at:]) for r in got["ranks"]))
                lo, rep = _lost_and_repeated(got, reference)
                lost[name] += lo
                repeated[name] += rep
                client.sync(client.scheduler.mdata_close_job, job=job, client=client.id)
                client.wait_for_workers(2 + standbys, timeout=120)  # the nanny restarted it
    out: dict[str, dict[str, Any]] = {}
    for name, standbys in configs.items():
        out[name] = {
            "mdata": statistics.median(stalls[name]), "unit": "s", "runs": stalls[name],
            "worst_wait_s": statistics.median(worst[name]),
            "reload_s": statistics.median(reloads[name]), "step_s": step_s,
            "samples_lost": lost[name], "samples_repeated": repeated[name],
            "goal": "about one step or less" if standbys else "", "note": f"median of {runs} kill -9",
        }
    return out


def _text_plan(sources):
    from mdata.cost import AttentionCost
    from mdata.mesh import ClientPlaceTree
    from mdata.plan import Plan

    return (Plan(sources).mix({s.name: 1.0 for s in sources}).cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=4096, global_batch=12)
            .distribute(ClientPlaceTree(dp=2)).seed(3).window(2))


def _pool_loaders(client) -> list[str]:
    return [a for a, w in client.scheduler_info()["workers"].items()
            if any(r.startswith("pool_") and n > 0 for r, n in w.get("resources", {}).items())]


def _wait_for_standbys(client, count: int, timeout: float = 120.0) -> None:
    """Until ``count`` standbys are warm and the pool is back to one loader."""
    def warm(dask_scheduler) -> int:
        book = dask_scheduler.extensions["mdata"].standbys.book.snapshot()["workers"]
        return sum(1 for w in book.values() if w["role"] == "standby" and w["warm"])

    deadline = time.monotonic() + timeout
    while (count and client.run_on_scheduler(warm) < count) or len(_pool_loaders(client)) != 1:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} warm standby(s) not ready within {timeout:.0f}s")
        time.sleep(0.1)


def kill_loader(client, job: str, killed: dict[str, Any]) -> None:
    """SIGKILL the pool's loader while it holds chunks of ``job``; ``killed`` receives who it
    was, what it held, and (from a watcher thread) ``reload_s``."""
    (loader,) = _pool_loaders(client)

    def held(dask_worker):
        return [k for k in dask_worker.data.keys()
                if isinstance(k, tuple) and k[:2] == ("mdata-load", job)]

    info = client.run(lambda dask_worker: (os.getpid(), held(dask_worker)), workers=[loader])
    pid, keys = info[loader]
    keys = [tuple(k) for k in keys]  # msgpack brought the task keys back as lists
    killed.update(address=loader, pid=pid, chunks=keys, time=time.monotonic(), wall=time.time())
    os.kill(pid, signal.SIGKILL)
    watcher = threading.Thread(target=_watch_reload, args=(client, keys, killed), daemon=True)
    watcher.start()
    killed["watcher"] = watcher


def _watch_reload(client, keys: list, into: dict, timeout: float = 120.0) -> None:
    """Seconds from the kill until every chunk the dead loader held is in memory again (or was
    released, no longer needed): how long the pool was short of those chunks."""
    def pending(dask_scheduler, keys=tuple(keys), dead=into["address"]) -> int:
        tasks = dask_scheduler.tasks
        if dead in dask_scheduler.workers:
            return len(keys)  # the scheduler has not noticed the kill yet
        return sum(1 for k in keys if k in tasks and tasks[k].state != "memory")

    while time.monotonic() - into["time"] < timeout:
        if client.run_on_scheduler(pending) == 0:
            into["reload_s"] = time.monotonic() - into["time"]
            return
        time.sleep(0.05)


def _drive_in_lockstep(client, job: str, steps: int, step_s: float, *, kill_at: int | None = None) -> dict:
    """Two ranks in lock step (:mod:`benchmarks.lockstep`); kill the loader before ``kill_at``.
    Per rank and step: (step, sample ids, token hash, seconds blocked)."""
    killed: dict[str, Any] = {}

    def between(meeting: int) -> None:
        if kill_at is not None and meeting == kill_at:
            kill_loader(client, job, killed)

    got = drive_in_lockstep(
        client, job, steps=steps, step_s=step_s, between=between,
        keep=lambda batch: (batch["step"], batch["sample_ids"].tolist(), token_hash(batch)))
    if killed:
        killed.pop("watcher").join()
    return {"ranks": {r: [(*kept, waited) for kept, waited in rows] for r, rows in got.items()},
            "killed": killed}


def _stall(got: dict, reference: dict, kill_at: int) -> float:
    """Extra seconds blocked from the kill on, against the uninterrupted run (slower rank)."""
    return max(sum(w for *_, w in got["ranks"][r][kill_at:])
               - sum(w for *_, w in reference["ranks"][r][kill_at:]) for r in got["ranks"])


def _lost_and_repeated(got: dict, reference: dict) -> tuple[int, int]:
    """Samples (id and token hash per step) the uninterrupted run had and this one missed, and
    samples this one received more often than it."""
    def samples(run: dict) -> Counter:
        return Counter((r, step, tuple(sid), digest) for r, rows in run["ranks"].items()
                       for step, ids, digest, _ in rows for sid in ids)

    want, have = samples(reference), samples(got)
    return sum((want - have).values()), sum((have - want).values())
