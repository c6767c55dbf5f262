"""User story: start a cluster with `mdata cluster up`, attach a driver and trainers by address."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from fixtures_cli import printed_lines

from mdata.observe.dashboard_pages import PAGES
from mdata.driver import submit_job
from mdata.trainer import Loader
from mdata.cost import AttentionCost
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def test_cluster_up_prints_addresses_and_serves_trainers(example_corpus):
    from distributed import Client

    from mdata.data.example import example_sources

    proc = cluster_up("--data", str(example_corpus))
    try:
        lines = printed_lines(proc)
        address = lines["scheduler"]
        assert address.startswith("tcp://127.0.0.1:")
        assert lines["dashboard"].startswith("http://127.0.0.1:")
        # a line per mdata page, its full URL on the same dashboard
        base = lines["dashboard"].removesuffix("/status")
        assert [k for k in lines if k.startswith("mdata ")] == [f"mdata {p.title}" for p in PAGES]
        assert all(lines[f"mdata {p.title}"].startswith(base + p.route + "  (") for p in PAGES)
        assert "captions" in lines["pools"]

        sources = example_sources(example_corpus)
        plan = (Plan(sources).mix({s.name: 1.0 for s in sources}).cost(AttentionCost(a=1.0, b=2048.0))
                .balance(micro_batches=1, max_tokens=4096, global_batch=10)
                .distribute(ClientPlaceTree(dp=1)).special_tokens(image_token_id=100_277).seed(2))
        with Client(address, set_as_default=False) as client:
            submit_job(client, plan, job="up")
            # a process that only serves moves its long-lived objects out of full garbage
            # collections (mdata.gc_freeze): the scheduler's and every worker's
            assert client.run_on_scheduler(gc.get_freeze_count) > 10_000
            assert all(n > 10_000 for n in client.run(gc.get_freeze_count).values())
        with Loader(address, job="up", rank=0, world_size=1, steps=2, timeout=60) as loader:
            batches = list(loader)
        assert [b["step"] for b in batches] == [0, 1]
        assert all(len(b["sample_ids"]) == 10 for b in batches)
    finally:
        stop(proc)


def test_cluster_up_with_a_plan_file_serves_the_users_own_sources(tmp_path):
    """`mdata cluster up --plan FILE --job NAME` serves the plan's own sources and registers it;
    a trainer attaches by address and job name alone."""
    import json

    from mdata.sources import Source, TokenizeText

    data = tmp_path / "notes"
    data.mkdir()
    for shard in range(2):
        lines = [json.dumps({"body": f"note {shard}-{i}: " + "words " * (i % 7 + 1)}) for i in range(40)]
        (data / f"part-{shard}.jsonl").write_text("\n".join(lines) + "\n")
    plan = (Plan([Source("notes", str(data), format="jsonl", chunk_rows=16,
                         transform=TokenizeText(field="body"))])
            .mix({"notes": 1.0}).cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=512, global_batch=6)
            .distribute(ClientPlaceTree(dp=1)).seed(9))
    path = plan.to_file(tmp_path / "notes.yaml")

    proc = cluster_up("--plan", str(path), "--job", "notes")
    try:
        lines = printed_lines(proc)
        assert "notes" in lines["pools"] and "chat" not in lines["pools"]
        assert lines["job"] == f"notes (fingerprint {plan.fingerprint()}, world size 1)"
        with Loader(lines["scheduler"], job="notes", rank=0, world_size=1, steps=3, timeout=60) as loader:
            batches = list(loader)
        assert [b["step"] for b in batches] == [0, 1, 2]
        ids = {tuple(r) for b in batches for r in b["sample_ids"].tolist()}
        assert len(ids) == 18 and {s for s, _, _ in ids} == {0}  # source 0: notes, no repeats
        # the same plan file drives a torchrun job (the documented trainer script): the rank's
        # Loader above closed, so the torchrun rank takes it over where it stopped, at step 3
        examples = Path(__file__).resolve().parents[2] / "docs" / "examples"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(examples), str(examples.parents[1])])}
        train = subprocess.run(
            [str(Path(sys.executable).with_name("torchrun")), "--nproc-per-node", "1",
             "--master-port", str(_free_port()), str(examples / "train.py"),
             "--scheduler", lines["scheduler"], "--job", "notes", "--plan", str(path),
             "--steps", "2"],
            capture_output=True, text=True, timeout=180, env=env)
        assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
        assert "rank 0 step 3:" in train.stdout and "rank 0 step 4:" in train.stdout
        assert "rank 0 resumes at step 5" in train.stdout
    finally:
        stop(proc)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_up(*args: str) -> subprocess.Popen:
    """``mdata cluster up ARGS`` on free ports, its output readable line by line (its log goes
    to a file that :func:`stop` reads)."""
    mdata = Path(sys.executable).with_name("mdata")
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(
        [str(mdata), "cluster", "up", *args, "--port", "0", "--dashboard-address", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=log, text=True)
    proc.log = log
    return proc


def stop(proc: subprocess.Popen, how: int = signal.SIGINT) -> None:
    """Ctrl-C (or ``how``): the cluster shuts down cleanly, without a traceback in its log,
    which holds no Dask INFO line (Dask logs at WARNING unless `-v` asks for more)."""
    proc.send_signal(how)
    assert proc.wait(timeout=60) == 0
    proc.log.seek(0)
    log = proc.log.read()
    proc.log.close()
    assert "Traceback" not in log, log[-6000:]
    assert " - INFO - " not in log, log[-6000:]



def test_cluster_up_listens_on_loopback_only_with_a_dashboard_address_without_host(tmp_path):
    """The default ``--dashboard-address`` names a port only (':8787'); such an address binds to
    ``--host`` (loopback) like the scheduler, never to every interface. Read from the kernel for
    the command's process and every worker process under it."""
    from urllib.parse import urlparse

    from fixtures_sockets import listening, not_loopback, process_tree

    from mdata.sources import Source, TokenizeText

    data = tmp_path / "notes"
    data.mkdir()
    (data / "part-0.jsonl").write_text("".join(f'{{"body": "note {i}"}}\n' for i in range(20)))
    plan = (Plan([Source("notes", str(data), format="jsonl", transform=TokenizeText(field="body"))])
            .mix({"notes": 1.0}).cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=512, global_batch=4)
            .distribute(ClientPlaceTree(dp=1)).seed(1))
    path = plan.to_file(tmp_path / "notes.yaml")
    mdata = Path(sys.executable).with_name("mdata")
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([str(mdata), "cluster", "up", "--plan", str(path), "--job", "notes",
                             "--port", "0", "--dashboard-address", ":0"],
                            stdout=subprocess.PIPE, stderr=log, text=True)
    proc.log = log
    try:
        lines = printed_lines(proc)
        dashboard = urlparse(lines["dashboard"])
        assert dashboard.hostname == "127.0.0.1"
        pids = process_tree(proc.pid)
        assert len(pids) >= 3  # the command (scheduler, nannies), a loader, a constructor
        sockets = listening(pids)
        assert dashboard.port in {port for _, port in sockets[proc.pid]}, sockets
        assert not_loopback(sockets) == {}, sockets
    finally:
        # stopped as systemd or Kubernetes stop it (SIGTERM): as cleanly as by Ctrl-C, and no
        # process of its tree is left
        stop(proc, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()]


def test_a_plan_whose_source_path_matches_nothing_fails_in_one_line(tmp_path):
    """The scheduler and the loader answer the registration with a typed error; `cluster up`
    prints its addresses, then that error once, naming the plan file, the source and its path:
    no traceback from the scheduler, the worker or the shutdown."""
    from mdata.sources import Source, TokenizeText

    missing = tmp_path / "no-such-folder" / "*.jsonl"
    plan = (Plan([Source("notes", str(missing), format="jsonl", transform=TokenizeText(field="body"))])
            .mix({"notes": 1.0}).balance(micro_batches=1, max_tokens=512, global_batch=4))
    path = plan.to_file(tmp_path / "notes.yaml")
    mdata = Path(sys.executable).with_name("mdata")
    proc = subprocess.run([str(mdata), "cluster", "up", "--plan", str(path), "--port", "0",
                           "--dashboard-address", "127.0.0.1:0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stdout.startswith("scheduler: tcp://127.0.0.1:"), proc.stdout
    assert proc.stderr.splitlines() == [
        f"mdata: error: plan file {str(path)!r}: job 'default' not registered: source 'notes': "
        f"no jsonl files match {str(missing)!r} (check the URL and storage_options; a glob looks "
        "like 's3://bucket/prefix/*.jsonl')"], proc.stderr[-3000:]
