"""Finding the host agent: its private directory, lock, address file, and the token it checks."""

from __future__ import annotations

import asyncio
import fcntl
import os
import stat
import subprocess
import sys
import time

import pytest

from mdata.errors import TrainerError
from mdata.trainer.agent_lock import (
    AgentAddress, agent_dir, agent_key, agent_paths, held_lock, pid_alive, read_address,
    pid_namespace, remove_address, remove_lock, write_address, write_spec,
)
from mdata.trainer.host_agent import HostAgent


def test_the_directory_is_made_private_and_a_shared_one_is_refused(tmp_path):
    folder = agent_dir(str(tmp_path))
    assert folder == tmp_path / "mdata-agents"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    folder.chmod(0o755)  # others may enter: their files could be planted there
    with pytest.raises(TrainerError, match="not a private directory"):
        agent_dir(str(tmp_path))


def test_the_key_names_the_scheduler_and_the_user():
    a = agent_key("tcp://10.0.0.1:8786", "alice")
    assert a == agent_key("tcp://10.0.0.1:8786", "alice")
    assert a != agent_key("tcp://10.0.0.1:8787", "alice")
    assert a != agent_key("tcp://10.0.0.1:8786", "bob")


def test_ranks_in_another_pid_namespace_get_another_agent():
    # an agent watches its ranks by pid: a container sharing /tmp must not find this one
    assert pid_namespace().startswith("pid:[")
    mine = agent_key("tcp://10.0.0.1:8786", "alice")
    assert mine == agent_key("tcp://10.0.0.1:8786", "alice", pid_namespace())
    assert mine != agent_key("tcp://10.0.0.1:8786", "alice", "pid:[4026532999]")


def test_an_address_file_is_read_only_while_private_and_its_agent_runs(tmp_path):
    lock, path = agent_paths("tcp://127.0.0.1:1", str(tmp_path))
    assert lock.parent == path.parent and lock != path
    assert read_address(path) is None  # none yet
    mine = AgentAddress("tcp://127.0.0.1:5555", "t" * 64, os.getpid(), "tcp://127.0.0.1:1")
    write_address(path, mine)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_address(path) == mine
    path.chmod(0o644)  # readable by others: its token is no secret any more
    assert read_address(path) is None
    path.chmod(0o600)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_address(path, AgentAddress(mine.address, mine.token, dead.pid, mine.scheduler))
    assert read_address(path) is None  # its agent is gone
    path.write_text("{not json")
    assert read_address(path) is None


def test_an_agent_removes_only_its_own_address_file(tmp_path):
    _, path = agent_paths("tcp://127.0.0.1:2", str(tmp_path))
    write_address(path, AgentAddress("tcp://127.0.0.1:5555", "t", os.getpid(), "s"))
    remove_address(path, os.getpid() + 1)  # a predecessor leaving: the file names its successor
    assert path.exists()
    remove_address(path, os.getpid())
    assert not path.exists()


def test_the_lock_is_exclusive(tmp_path):
    lock, _ = agent_paths("tcp://127.0.0.1:3", str(tmp_path))
    with held_lock(lock):
        fd = os.open(lock, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released with the block
    finally:
        os.close(fd)


def test_a_lock_removed_by_its_holder_is_taken_again_on_the_file_that_replaces_it(tmp_path,
                                                                                  monkeypatch):
    # An agent leaving removes its lock file while holding it. A rank that had opened the old
    # file and was waiting must end up locking the file now at the path, or a third process
    # (which opens the new file) would hold "the" lock at the same time.
    import threading

    lock, _ = agent_paths("tcp://127.0.0.1:4", str(tmp_path))
    real_flock, waiting = fcntl.flock, threading.Event()

    def flock(fd, op):
        if threading.current_thread().name == "waiter":
            waiting.set()  # it has opened the file it is about to wait on
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    holding, release, seen = threading.Event(), threading.Event(), []

    def waiter():
        with held_lock(lock):
            seen.append(lock.exists())
            holding.set()
            release.wait(10)

    thread = threading.Thread(target=waiter, name="waiter")
    with held_lock(lock):
        thread.start()
        assert waiting.wait(10)
        remove_lock(lock)  # as an agent that leaves does
    assert holding.wait(10)
    assert seen == [True]
    fd = os.open(lock, os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            real_flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
        release.set()
        thread.join(10)
    remove_lock(lock)
    assert not lock.exists()


def test_a_zombie_is_not_alive():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    for _ in range(500):  # it exits and is not reaped yet: a zombie, still in the process table
        if not pid_alive(child.pid):
            break
        time.sleep(0.02)
    assert not pid_alive(child.pid)
    assert os.path.exists(f"/proc/{child.pid}")  # the zombie is there, and counted dead
    child.wait()
    assert pid_alive(os.getpid())


def test_the_start_file_is_private(tmp_path):
    spec = tmp_path / "x.spec"
    write_spec(spec, "{}")
    assert stat.S_IMODE(spec.stat().st_mode) == 0o600


def test_the_agent_answers_nothing_without_its_token_and_forwards_only_mdata_handlers():
    agent = HostAgent(client=None, token="s" * 64)
    handlers = agent.handlers()
    assert not {"identity", "echo", "dump_state"} & set(handlers)

    async def ask(name, **kw):
        return await handlers[name](None, **kw)

    refused = asyncio.run(ask("agent_hello", token="wrong", pid=1))
    assert "wrong host agent token" in refused["error"]["other"] and not agent.sessions
    assert "wrong host agent token" in asyncio.run(ask("agent_forward", token=None,
                                                       handler="mdata_status", msg={}))["error"]["other"]
    other = asyncio.run(ask("agent_forward", token="s" * 64, handler="retire_workers", msg={}))
    assert "not an mdata scheduler handler" in other["error"]["mdata"]["message"]


def test_a_killed_agents_closed_port_is_given_up_in_seconds_not_after_dasks_connect_timeout():
    # A rank that needs a new connection to an agent killed meanwhile meets a refused port, which
    # Dask retries until its connect timeout (30 s by default): the rank must go on alone sooner.
    import socket

    from mdata.trainer.agent_client import AGENT_CONNECT_S, AgentClient, AgentLost

    with socket.socket() as sock:  # a port nobody listens on any more
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = AgentClient("tcp://127.0.0.1:1", timeout=5)
    try:
        client.agent = AgentAddress(f"tcp://127.0.0.1:{port}", "token", os.getpid(), "x")
        began = time.monotonic()
        with pytest.raises(AgentLost, match="stopped answering"):
            client.sync(client.call, "agent_forward", handler="mdata_ack", msg={})
        assert time.monotonic() - began < AGENT_CONNECT_S + 5
    finally:
        client.close()
