"""What faults cost: the stall a trainer sees, and proof that nothing was lost or repeated.

Each figure runs a small job (two trainer ranks driven in lock step, a fixed simulated compute
time per step) on an embedded cluster, inflicts one fault with ``kill -9`` or a resume, and
compares what the ranks received (sample ids and a hash of the tokens, per step) with an
uninterrupted run of the same plan on the same cluster:

* ``reliability.constructor_kill_stall_s``: extra seconds the ranks waited for data over the steps
  after the constructor worker was killed (each step's wait minus the median wait of the
  uninterrupted run, summed), with ``samples_lost`` and ``samples_repeated`` (must be 0);
* ``reliability.live_resume_ok``: ranks that ran ahead restart from an earlier checkpoint on the
  live cluster; 1 when they then receive exactly the uninterrupted run's steps;
* ``reliability.loader_kill_stall_s.standby`` / ``.no_standby``: a loader holding chunks upcoming
  steps need is killed, with and without a warm standby (:mod:`benchmarks.reliability_loader`);
* ``reliability.storage_outage_recovery_s``: from the S3 server coming back to the next step
  every rank received (:mod:`benchmarks.reliability_storage`), with samples lost and repeated.

Figures are medians over repetitions (one in ``--quick``); the machine is noisy.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from collections import Counter

from benchmarks.harness import figure
from benchmarks.lockstep import token_hash
from benchmarks.reliability_loader import loader_kill_stall
from benchmarks.reliability_storage import storage_outage_recovery
from benchmarks.workload import corpus_dir
from mdata.cost import AttentionCost
from mdata.data.example import example_sources
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan

__all__ = ["run"]

STEP_S = 0.1  # simulated compute per step: prefetching can hide short waits, as in training
TEXT = ("chat", "scenes", "code")


def _plan(sources) -> Plan:
    return (Plan(sources).mix({s.name: 1.0 for s in sources})
            .cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=4096, global_batch=12)
            .distribute(ClientPlaceTree(dp=2)).seed(11).window(2))


def _received(batch) -> tuple:
    return batch["step"], tuple(map(tuple, batch["sample_ids"].tolist())), token_hash(batch)


def _drive(client, plan, job: str, steps: int, *, fault_at: int | None = None, fault=None,
           checkpoint: dict | None = None):
    """Two ranks in lock step; returns what each received, each step's wait, and the states."""
    from mdata.driver import submit_job
    from mdata.trainer import Loader

    submit_job(client, plan, job=job)
    got: dict[int, list] = {0: [], 1: []}
    waits: list[float] = []
    loaders = [Loader(client, job=job, rank=r, world_size=2, timeout=120,
                      checkpoint=None if checkpoint is None else checkpoint[r]) for r in range(2)]
    try:
        iters = [iter(loader) for loader in loaders]
        for step in range(steps):
            if step == fault_at:
                fault()
            began = time.monotonic()
            for rank, it in enumerate(iters):
                got[rank].append(_received(next(it)))
            waits.append(time.monotonic() - began)
            time.sleep(STEP_S)
        for loader in loaders:
            loader.mark_consumed()
        states = {r: loader.state_dict() for r, loader in enumerate(loaders)}
    finally:
        for loader in loaders:
            loader.close()
    return got, waits, states


def _lost_repeated(reference: dict[int, list], got: dict[int, list]) -> tuple[int, int]:
    """Sample ids the reference has and the run lacks (lost) or has more often (repeated)."""
    lost = repeated = 0
    for rank in reference:
        want = Counter(s for _, ids, _ in reference[rank] for s in ids)
        have = Counter(s for _, ids, _ in got[rank] for s in ids)
        lost += sum((want - have).values())
        repeated += sum((have - want).values())
    return lost, repeated


def _kill_constructor(client) -> None:
    workers = [a for a, w in client.scheduler_info()["workers"].items()
               if "mdata_constructor" in w.get("resources", {})]
    pid = client.run(os.getpid, workers=workers[:1])[workers[0]]
    os.kill(pid, signal.SIGKILL)


def constructor_kill_stall(client, plan, steps: int, fault_at: int, repeats: int) -> dict:
    reference, ref_waits, _ = _drive(client, plan, "reliability-reference", steps)
    typical = statistics.median(ref_waits)
    stalls, lost, repeated = [], 0, 0
    for i in range(repeats):
        got, waits, _ = _drive(client, plan, f"reliability-constructor-{i}", steps,
                               fault_at=fault_at, fault=lambda: _kill_constructor(client))
        stalls.append(sum(max(0.0, w - typical) for w in waits[fault_at:]))
        lo, rep = _lost_repeated(reference, got)
        lost, repeated = lost + lo, repeated + rep
    return {"reliability.constructor_kill_stall_s": figure(
        statistics.median(stalls), unit="s", goal="about one step",
        note=f"{repeats} run(s); samples_lost={lost}, samples_repeated={repeated}"),
        "reliability.constructor_kill.samples_lost": lost,
        "reliability.constructor_kill.samples_repeated": repeated}


def live_resume(client, plan, steps: int, resume_at: int) -> dict:
    """Ranks checkpoint after ``resume_at`` steps, run on, then all restart from the checkpoint
    while the job still runs: they must get the uninterrupted run's steps from there on."""
    reference, _, _ = _drive(client, plan, "resume-reference", steps)
    _, _, states = _drive(client, plan, "resume-live", resume_at)
    _drive(client, plan, "resume-live", 3)  # ran ahead of the checkpoint (then "crashed")
    got, _, _ = _drive(client, plan, "resume-live", steps - resume_at, checkpoint=states)
    expected = {r: reference[r][resume_at:] for r in reference}
    lost, repeated = _lost_repeated(expected, got)
    ok = got == expected
    return {"reliability.live_resume_ok": figure(float(ok), goal="1 (identical to uninterrupted)",
                                                 note=f"samples_lost={lost}, samples_repeated={repeated}"),
            "reliability.live_resume.samples_lost": lost,
            "reliability.live_resume.samples_repeated": repeated}


def run(quick: bool = False) -> dict:
    from mdata.driver import PoolSpec, start_cluster

    sources = [s for s in example_sources(corpus_dir()) if s.name in TEXT]
    plan = _plan(sources)
    steps, repeats = (10, 1) if quick else (16, 3)
    pools = [PoolSpec("text", tuple(s.name for s in sources), workers=2)]
    figures: dict = {}
    with start_cluster(sources, pools=pools, constructors=1, constructor_threads=1,
                       autoscale=False) as cluster:
        with cluster.client() as client:
            figures.update(constructor_kill_stall(client, plan, steps, fault_at=steps // 2,
                                                  repeats=repeats))
            figures.update(live_resume(client, plan, steps, resume_at=steps // 3))
    outage = storage_outage_recovery(repeats=repeats)
    figures["reliability.storage_outage_recovery_s"] = figure(
        outage.pop("reliability.storage_outage_recovery_s"), unit="s",
        goal="training goes on within seconds of storage returning",
        note=f"median of {repeats} outage(s) of 3 s; S3 (moto) stopped and restarted mid-run")
    figures.update(outage)
    for name, f in loader_kill_stall(runs=repeats if quick else 3, steps=10 if quick else 16,
                                     step_s=0.5).items():
        key = f"reliability.loader_kill_stall_s.{name}"
        figures[key] = figure(f["mdata"], unit="s", goal=f["goal"],
                              note=f"{f['note']}; step {f['step_s']}s; runs {[round(x, 3) for x in f['runs']]}")
        for extra in ("samples_lost", "samples_repeated", "reload_s", "worst_wait_s"):
            figures[f"{key}.{extra}"] = f[extra]
    return figures
