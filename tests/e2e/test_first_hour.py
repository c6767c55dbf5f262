"""User story: a newcomer's first hour. `mdata cluster up --plan FILE` with the default job name,
the documented trainer (docs/examples/train.py) attached by address alone, and the usual mistakes
(a wrong job name, an address where nothing listens, a wrong WORLD_SIZE), each timed to its clear
one-line error. Real processes only: what they print is what is checked."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from fixtures_cli import next_line, printed_lines

from mdata.observe.dashboard_pages import PAGES

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "docs" / "examples" / "train.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TRAIN.parent), str(REPO)]), **extra}


def _train_process(*args: str, timeout_s: str = "30s", world_size: int = 1,
                   timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    """docs/examples/train.py as rank 0 of a one-rank world (torchrun's variables set by hand,
    or torchrun itself for more ranks), with the Loader's timeout; the process and its seconds."""
    env = _env(DASK_MDATA__TRAINER__TIMEOUT=timeout_s)
    if world_size == 1:
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(_free_port()))
        cmd = [sys.executable, str(TRAIN), *args]
    else:
        cmd = [str(Path(sys.executable).with_name("torchrun")), "--nproc-per-node", str(world_size),
               "--master-port", str(_free_port()), str(TRAIN), *args]
    began = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    return proc, time.monotonic() - began


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`mdata cluster up --plan notes.yaml` (no --job, a live line each second): its printed
    lines (``.proc``: the command, whose later lines ``next_line`` reads)."""
    from test_cluster_up import cluster_up, stop

    from mdata.cost import AttentionCost
    from mdata.mesh import ClientPlaceTree
    from mdata.plan import Plan
    from mdata.sources import Source, TokenizeText

    tmp = tmp_path_factory.mktemp("first-hour")
    data = tmp / "notes"
    data.mkdir()
    for shard in range(2):
        rows = [json.dumps({"body": f"note {shard}-{i}: " + "words " * (i % 5 + 1)}) for i in range(30)]
        (data / f"part-{shard}.jsonl").write_text("\n".join(rows) + "\n")
    plan = (Plan([Source("notes", str(data), format="jsonl", chunk_rows=16,
                         transform=TokenizeText(field="body"))])
            .mix({"notes": 1.0}).cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=512, global_batch=4)
            .distribute(ClientPlaceTree(dp=1)).seed(3))
    path = plan.to_file(tmp / "notes.yaml")
    proc = cluster_up("--plan", str(path), "--status-every", "1")
    try:
        lines = printed_lines(proc)
        yield lines
    finally:
        stop(proc)


def test_cluster_up_and_train_py_agree_on_the_default_job_name(served):
    """No --job on either side: the trainer finds the job `cluster up --plan` registered."""
    # what a trainer and a browser need comes first, then the pools and the job
    pages = [f"mdata {page.title}" for page in PAGES]
    assert list(served)[:4 + len(pages)] == ["scheduler", "dashboard", *pages, "pools", "job"]
    # every mdata page by its full URL, each answering with its own titled page
    dashboard = served["dashboard"].removesuffix("/status")
    for page in PAGES:
        url, _, purpose = served[f"mdata {page.title}"].partition("  ")
        assert url == dashboard + page.route and purpose == f"({page.purpose})"
        with urllib.request.urlopen(url, timeout=30) as reply:
            assert f"<title>mdata: {page.title}</title>" in reply.read().decode()
    assert served["job"].startswith("default (fingerprint ")
    assert next_line(served.proc, "job 'default': step 0, ", timeout=15).endswith(
        "no trainer attached yet, sources waiting: none")
    proc, _ = _train_process("--scheduler", served["scheduler"], "--steps", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rank 0 step 0:" in proc.stdout and "rank 0 step 1:" in proc.stdout
    # cluster up's live line followed the trainer (a line each second while it changes)
    live = next_line(served.proc, "job 'default': step 2, ", timeout=15)
    assert " steps/s, stall " in live and live.endswith(", 1 rank, sources waiting: none"), live
    # and `mdata cluster status` says what the cluster did, without the dashboard
    status = subprocess.run([str(Path(sys.executable).with_name("mdata")), "cluster", "status",
                             served["scheduler"]], capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr[-3000:]
    out = status.stdout
    assert out.startswith(f"scheduler {served['scheduler']}: ") and "constructor" in out, out
    assert "loader of notes" in out, out
    assert "job 'default': step " in out and "trainers: 1 ranks attached" in out, out
    assert "storage: no source is waiting" in out, out


def test_a_wrong_job_name_says_at_once_which_jobs_exist(served):
    """The trainer says within a few seconds that `nope` is not registered and that `default`
    is; at its timeout it fails in one line naming `default`, without a traceback."""
    proc, seconds = _train_process("--scheduler", served["scheduler"], "--job", "nope",
                                   timeout_s="7s")  # the line repeats every 5 s: said twice
    print(f"wrong job name: clear error after {seconds:.1f}s (timeout 7s)")
    assert proc.returncode == 1
    waits = [line for line in proc.stderr.splitlines() if "waits for job 'nope'" in line]
    assert waits and "'default'" in waits[0], proc.stderr[-3000:]
    assert len(waits) >= 2  # repeated every few seconds while it waits
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("rank 0: TrainerTimeoutError: rank 0: job 'nope' was not registered")
    assert "'default'" in last


def test_a_wrong_world_size_fails_in_seconds_saying_what_to_do(served):
    """The plan's mesh has one rank; `torchrun --nproc-per-node 2` (the wrong count) fails at once:
    each rank says both sizes and both ways out, in one line of its own."""
    proc, seconds = _train_process("--scheduler", served["scheduler"], world_size=2,
                                   timeout_s="60s")
    print(f"wrong WORLD_SIZE: clear error after {seconds:.1f}s (timeout 60s)")
    assert proc.returncode != 0
    said = [line for line in proc.stderr.splitlines() if "but this trainer says WORLD_SIZE=2" in line]
    assert len(said) == 2, proc.stderr[-4000:]  # one line per rank
    assert all("(world size 1)" in line and "`torchrun --nproc-per-node 1`" in line
               and "change the plan's mesh" in line for line in said), said
    assert seconds < 45, seconds  # two Pythons with torch, then one answer each: not the timeout


def test_an_address_with_nothing_listening_fails_in_seconds_in_one_line():
    address = f"tcp://127.0.0.1:{_free_port()}"
    proc, seconds = _train_process("--scheduler", address, timeout_s="120s")
    print(f"dead address: clear error after {seconds:.1f}s (timeout 120s)")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert f"cannot reach the mdata scheduler at {address!r}: nothing listens there" in lines[0]
    assert seconds < 30  # the 5 s refusal window plus starting Python and torch, not 120 s
