"""The command line's edges: ``--version``, a reader that leaves the pipe early, and the lines of
``mdata cluster status`` (formatted from a job's status without a cluster; the e2e first-hour
test runs the command against ``mdata cluster up``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mdata.cli import main
from mdata.driver.cluster_status import describe_job, describe_workers

MDATA = str(Path(sys.executable).with_name("mdata"))


def test_version_prints_the_installed_distribution(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    from importlib.metadata import version

    assert capsys.readouterr().out.strip() == f"mdata {version('mdata-orchestrator')}"


def test_a_reader_that_leaves_early_is_not_an_error(example_corpus, tmp_path):
    """`mdata plan show plan.yaml | head -1` ends quietly, with exit status 0."""
    from mdata.data.example import example_sources
    from mdata.plan import Plan

    sources = example_sources(example_corpus)
    path = Plan(sources).mix({s.name: float(s.name == "chat") for s in sources}).to_file(tmp_path / "plan.yaml")
    proc = subprocess.run(f"'{MDATA}' plan show '{path}' | head -c 10", shell=True,
                          capture_output=True, text=True, timeout=120,
                          executable="/bin/bash", env=None)
    assert len(proc.stdout) == 10
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr


def test_every_option_says_what_it_does():
    from mdata.cli import build_parser

    def walk(parser, path):
        for action in parser._actions:
            if getattr(action, "choices", None) and isinstance(action.choices, dict):
                for name, sub in action.choices.items():
                    yield from walk(sub, path + [name])
            elif action.option_strings and action.dest not in ("help", "version"):
                yield " ".join(path), action.option_strings[-1], action.help

    silent = [(cmd, opt) for cmd, opt, text in walk(build_parser(), ["mdata"]) if not text]
    assert silent == []


def test_workers_are_described_by_what_they_serve():
    workers = {
        "tcp://a:1": {"resources": {"pool_chat": 1.0, "pool_code": 1.0}},
        "tcp://a:2": {"resources": {"pool_chat": 1.0, "pool_code": 1.0}},
        "tcp://b:1": {"resources": {"mdata_constructor": 1.0}},
        "tcp://c:1": {"resources": {"standby_images": 1.0}},
    }
    assert describe_workers(workers) == "4 workers: 1 constructor, 2 loader of chat+code, 1 standby"
    assert describe_workers({}) == "0 workers"


def test_a_jobs_lines_say_how_far_it_got_who_waits_and_what_storage_does():
    status = {
        "job": "pretrain", "failure": None, "uptime_s": 95.2,
        "counters": {"planned_step": 14, "balanced_step": 12, "consumed_step": 9, "chunks_loaded": 30,
                     "truncated": 0, "skipped": {"chat": 0, "scenes": 2}},
        "trainer_wait_s": {"0": 0.5, "1": 2.25},
        "pool_targets": {"chat": {"workers": 2, "reason": "demand 1.4 busy threads / 1 per worker"}},
        "storage_waits": {"scenes": {"since": 1000.0, "attempts": 7, "last_error": "ConnectionRefused"}},
    }
    lines = describe_job(status, now=1030.0)
    assert lines[0] == ("job 'pretrain': step 9 consumed by every rank (balanced up to 12, "
                        "planned up to 14), up 95s")
    assert "  trainers: 2 ranks attached; waited for data 2.8s in all, most rank 1 (2.2s)" in lines
    assert "  pool chat: 2 workers wanted (demand 1.4 busy threads / 1 per worker)" in lines
    assert ("  storage: source 'scenes' waiting since 30s ago, 7 attempts; last error: "
            "ConnectionRefused") in lines
    assert "  skipped samples: {'scenes': 2}" in lines
    failed = describe_job({**status, "failure": "source 'chat', shard 3: corrupt", "trainer_wait_s": {},
                           "storage_waits": {}}, now=1030.0)
    assert "  FAILED: source 'chat', shard 3: corrupt" in failed
    assert "  trainers: none has asked for a batch yet" in failed and "  storage: no source is waiting" in failed


def test_every_error_the_troubleshooting_page_names_imports_from_mdata_errors():
    """The page promises that every mdata error is an MdataError importable from mdata.errors
    (InvalidRequestError and MessageError live with the wire code, and are re-exported)."""
    import re

    import mdata.errors as errors

    page = (Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md").read_text()
    names = {name for heading in re.findall(r"^### (.+)$", page, re.M)
             for name in re.findall(r"\b([A-Z][A-Za-z]+Error)\b", heading)}
    assert {"InvalidRequestError", "StorageUnavailableError", "SchedulerLostError"} <= names
    for name in sorted(names):
        cls = getattr(errors, name, None)
        assert cls is not None, f"docs/troubleshooting.md names {name}, which mdata.errors lacks"
        assert issubclass(cls, errors.MdataError), name
