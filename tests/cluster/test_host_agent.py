"""Trainer processes of one host share one Dask client through the host agent.

Four trainer processes (spawned, one rank each, as torchrun starts them) attach by scheduler
address with ``mdata.trainer.host-agent`` on: the scheduler sees one new client for all four,
they receive exactly the samples (ids and token hashes) of a run with the agent off, and the
agent exits once they are gone. Killing the agent (SIGKILL) mid-run changes nothing the ranks
receive: each goes on with a client of its own. Killing a rank under a live agent ends its
lease, so the trainer restarted takes its rank back; killing them all ends the agent. Under
``broadcast_at("tp")`` the ranks fed by broadcast take their steps' checkpoints from the agent's
hub: the scheduler hears (almost) nothing from them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import threading
import time

import pytest

from mdata.cost import AttentionCost
from mdata.driver import submit_job
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan
from mdata.trainer.agent_lock import agent_paths, pid_alive, read_address

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

RANKS = 4
STEPS = 8


def _plan(sources, broadcast=None) -> Plan:
    text = [s for s in sources if s.name in ("chat", "code")]
    return (Plan(text).mix({"chat": 1.0, "code": 1.0}).cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=4096, global_batch=8)
            .distribute(ClientPlaceTree(dp=2, tp=2)).broadcast_at(broadcast).seed(7).window(3))


def _clients(client) -> set[str]:
    return set(client.run_on_scheduler(lambda dask_scheduler=None: list(dask_scheduler.clients)))


def run_ranks(client, address: str, job: str, *, agent: bool, step_s: float = 0.0,
              at_step=None) -> tuple[dict[int, tuple], set[str]]:
    """Run RANKS trainer processes of ``job``; per rank ``(received, client id, lost)``, and the
    clients the scheduler had while they ran, beyond those it had before. ``at_step(rank,
    step)`` is called in the test as the ranks report their steps."""
    from agent_trainer import Inbox, silent_trainers, trainer

    before = _clients(client)
    seen: set[str] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.update(_clients(client) - before)
            stop.wait(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    ctx = mp.get_context("spawn")
    inbox = Inbox(ctx)
    procs = [ctx.Process(target=trainer, args=(r, RANKS, address, job, STEPS, inbox.writer(r),
                                               agent, step_s))
             for r in range(RANKS)]
    for p in procs:
        p.start()
    inbox.started()
    results, errors, last = {}, [], {}
    try:
        while len(results) + len(errors) < RANKS:
            kind, rank, *rest = inbox.get(timeout=180)
            last[rank] = (kind, rest[0] if kind == "step" else "")
            if kind == "step" and at_step is not None:
                at_step(rank, rest[0])
            elif kind == "done":
                results[rank] = tuple(rest)
            elif kind == "error":
                errors.append(f"rank {rank}: {rest[0]}")
    except queue.Empty:
        errors.append(silent_trainers(procs, last, address))
    finally:
        stop.set()
        watcher.join(timeout=10)  # a scheduler call stuck in it must not hang the test
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert not errors, errors
    return results, seen


def _close(client, *jobs: str) -> None:
    for job in jobs:
        client.sync(client.scheduler.mdata_close_job, job=job, client=client.id)


def _wait_gone(pid: int, within: float = 20.0) -> bool:
    deadline = time.monotonic() + within
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not pid_alive(pid)


@pytest.fixture(scope="module")
def reference(mdata_cluster, example_sources_small):
    """What the ranks receive with the agent off: each process its own client."""
    from distributed import Client

    with Client(mdata_cluster.scheduler_address, set_as_default=False) as client:
        submit_job(client, _plan(example_sources_small), job="agent-off")
        results, seen = run_ranks(client, mdata_cluster.scheduler_address, "agent-off",
                                  agent=False)
        _close(client, "agent-off")
    return results, seen


def test_four_trainer_processes_share_one_client_and_get_the_same_samples(
        mdata_cluster, client, example_sources_small, reference):
    address = mdata_cluster.scheduler_address
    off, off_clients = reference
    assert len(off_clients) == RANKS  # the comparison: one client per process without the agent
    submit_job(client, _plan(example_sources_small), job="agent-on")
    agents: list[int] = []

    def note_agent(rank: int, step: int) -> None:
        found = read_address(agent_paths(address)[1])
        if found is not None and found.pid not in agents:
            agents.append(found.pid)

    on, on_clients = run_ranks(client, address, "agent-on", agent=True, at_step=note_agent)
    _close(client, "agent-on")
    assert len(on_clients) == 1, on_clients  # one client for the four processes
    assert {r[1] for r in on.values()} == on_clients  # ... and it is the agent's
    assert all(r[2] is None for r in on.values())  # no rank lost the agent
    for rank in range(RANKS):
        assert [b[0] for b in on[rank][0]] == list(range(STEPS))
        assert on[rank][0] == off[rank][0], rank  # same ids, same tokens, every step
    assert len(agents) == 1, agents
    assert _wait_gone(agents[0]), "the host agent outlived its ranks"
    assert read_address(agent_paths(address)[1]) is None


def test_a_killed_agent_changes_nothing_the_ranks_receive(mdata_cluster, client,
                                                          example_sources_small, reference):
    address = mdata_cluster.scheduler_address
    off, _ = reference
    submit_job(client, _plan(example_sources_small), job="agent-killed")
    killed: list[int] = []

    def kill_agent(rank: int, step: int) -> None:
        if step == 2 and not killed:
            found = read_address(agent_paths(address)[1])
            assert found is not None, "no host agent is running mid-run"
            os.kill(found.pid, signal.SIGKILL)
            killed.append(found.pid)

    got, _ = run_ranks(client, address, "agent-killed", agent=True, step_s=0.1, at_step=kill_agent)
    _close(client, "agent-killed")
    assert killed
    for rank in range(RANKS):
        assert got[rank][0] == off[rank][0], rank  # every step, the same samples and tokens
        assert got[rank][2] is not None and "stopped answering" in got[rank][2], got[rank][2]
    assert len({got[r][1] for r in range(RANKS)}) == RANKS  # then each went on with its own client


@pytest.mark.slow  # an agent's loss by default: test_a_killed_agent_changes_nothing_the_ranks_receive
def test_the_agent_exits_when_its_ranks_are_killed(mdata_cluster, client, example_sources_small):
    """Ranks killed with SIGKILL never say goodbye: the agent sees their processes gone."""
    from agent_trainer import Inbox, trainer

    address = mdata_cluster.scheduler_address
    submit_job(client, _plan(example_sources_small), job="agent-orphaned")
    ctx = mp.get_context("spawn")
    inbox = Inbox(ctx)
    procs = [ctx.Process(target=trainer, args=(r, RANKS, address, "agent-orphaned", STEPS,
                                               inbox.writer(r), True, 1.0)) for r in range(2)]
    for p in procs:
        p.start()
    inbox.started()
    kind, *_ = inbox.get(timeout=180)  # a rank took a step: the agent serves it
    assert kind == "step"
    found = read_address(agent_paths(address)[1])
    assert found is not None and pid_alive(found.pid)
    # a stuck agent is diagnosed as a stuck rank is: SIGUSR1 writes its threads' stacks to its log
    log = agent_paths(address)[0].with_suffix(".log")
    os.kill(found.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while "(most recent call first)" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, "the agent wrote no stacks to its log on SIGUSR1"
        time.sleep(0.05)
    # its own frames (the serving loop) among them; the dump is written thread by thread, so
    # the first thread's header can be read before the thread that runs the agent's code
    while "host_agent.py" not in log.read_text():
        assert time.monotonic() < deadline, f"no frame of the agent's own code: {log.read_text()}"
        time.sleep(0.05)
    for p in procs:
        os.kill(p.pid, signal.SIGKILL)
        p.join(timeout=30)
    assert _wait_gone(found.pid), "the host agent outlived its killed ranks"
    assert read_address(agent_paths(address)[1]) is None
    log.unlink(missing_ok=True)  # kept by the agent because it is not empty
    _close(client, "agent-orphaned")


def test_a_killed_rank_restarted_takes_its_rank_back_from_the_agent(mdata_cluster, client,
                                                                    example_sources_small,
                                                                    reference):
    """The agent lives on when one of its ranks is killed; the rank's lease, held with the
    agent's client, ends with the process, so a restarted trainer leases it again (and gets
    the steps an uninterrupted run gives) instead of a RankTakenError."""
    from agent_trainer import Inbox, silent_trainers, trainer

    address = mdata_cluster.scheduler_address
    off, _ = reference
    submit_job(client, _plan(example_sources_small), job="agent-restart")
    ctx = mp.get_context("spawn")
    inbox = Inbox(ctx)

    def start(rank: int, key=None):
        proc = ctx.Process(target=trainer, args=(rank, RANKS, address, "agent-restart", STEPS,
                                                 inbox.writer(rank if key is None else key),
                                                 True, 0.2, True))
        proc.start()
        inbox.started()
        return proc

    procs = {r: start(r) for r in range(RANKS)}
    results, errors, restarted, last = {}, [], False, {}
    while len(results) + len(errors) < RANKS:
        try:
            kind, rank, *rest = inbox.get(timeout=180)
        except queue.Empty:  # a hang: show where each trainer is before failing
            errors.append(f"{silent_trainers(procs.values(), last, address)}; restarted: {restarted}")
            break
        last[rank] = (kind, rest[0] if kind == "step" else "")
        if kind == "step" and rank == 1 and rest[0] == 2 and not restarted:
            os.kill(procs[1].pid, signal.SIGKILL)
            procs[1].join(timeout=30)
            inbox.drop(1)  # a message it was sending when killed may be cut short
            agent = read_address(agent_paths(address)[1])
            assert agent is not None and pid_alive(agent.pid)  # the others still use it
            procs[1] = start(1, key="1-restarted")
            restarted = True
        elif kind == "done":
            results[rank] = rest
        elif kind == "error":
            errors.append(f"rank {rank}: {rest[0]}")
            break  # the others would only wait for this rank until their timeout
    for p in procs.values():
        p.join(timeout=0 if errors else 30)
        if p.is_alive():
            p.kill()
    _close(client, "agent-restart")
    assert restarted and not errors, errors
    for rank in (0, 2, 3):
        assert results[rank][0] == off[rank][0], rank
    again = results[1][0]
    assert again and again[-1][0] == STEPS - 1  # the restarted rank went on to the end
    assert again == off[1][0][again[0][0]:], again[0][0]  # ... with the uninterrupted steps
    assert len({r[1] for r in results.values()}) == 1  # all four, the restart too, on the agent


@pytest.mark.slow  # broadcast through a shared client by default: test_broadcast_fed.py, test_host_agent's own four-process run
def test_ranks_fed_by_broadcast_ask_nothing_per_step_through_the_agent(
        mdata_cluster, client, example_sources_small, reference):
    """Ranks 1 and 3 (TP rank 1) get their batch by broadcast: through the agent they take each
    step's checkpoint from what its hub got for ranks 0 and 2, so the scheduler gets no per-step
    message of theirs (a fed process that attached before any receiving one asks for its first
    step itself: at most that). The receiving ranks get the samples of the run without the agent."""
    from test_broadcast_fed import count_per_rank, counted

    address = mdata_cluster.scheduler_address
    off, _ = reference
    job = "agent-broadcast"
    submit_job(client, _plan(example_sources_small, "tp"), job=job)
    count_per_rank(client, job)
    got, clients = run_ranks(client, address, job, agent=True)
    counts = counted(client)
    _close(client, job)
    assert len(clients) == 1, clients
    for rank in (1, 3):
        assert got[rank][0] == [(s, "broadcast from", rank - 1, s + 1) for s in range(STEPS)]
        mine = counts.get(rank, {})
        assert set(mine) <= {"mdata_host_location"} and mine.get("mdata_host_location", 0) <= 2, \
            counts
    for rank in (0, 2):
        # the TP receiver holds its group's one copy: the samples the rank got without broadcast
        assert [(s, ids) for s, ids, _ in got[rank][0]] == [(s, ids) for s, ids, _ in off[rank][0]]
