"""User story: a newcomer runs a plan file that ships with mdata from wherever their shell is.
`mdata plan simulate docs/examples/vlm.yaml` plans steps on the example corpus the file's
relative urls name, read from the file's folder, not the current directory; without the corpus
there, `mdata plan show` says in one line which plan file looked in which folder. Real processes;
what they print is what is checked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_plans import copy_of_examples, examples_copy  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

MDATA = str(Path(sys.executable).with_name("mdata"))


def test_a_shipped_plan_simulates_from_another_directory(examples_copy, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([MDATA, "plan", "simulate", str(examples_copy / "vlm.yaml"), "--steps", "3",
                           "--max-rows-per-shard", "16"],
                          capture_output=True, text=True, timeout=120, cwd=elsewhere)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("simulated 3 steps: 64 samples per step over 4 DP ranks"), done.stdout
    for name in ("chat", "scenes", "books", "code", "captions"):
        assert any(line.split()[:1] == [name] for line in done.stdout.splitlines()), (name, done.stdout)
    assert not list(elsewhere.iterdir())


def test_without_the_corpus_the_error_names_the_plan_file_and_the_folder(tmp_path):
    folder = copy_of_examples(tmp_path / "checkout", corpus=None)
    done = subprocess.run([MDATA, "plan", "show", "docs/examples/text.yaml"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path / "checkout")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        "mdata: error: source 'chat': plan file 'docs/examples/text.yaml' names "
        f"'../../example-data/chat/*.parquet', and {tmp_path / 'checkout' / 'example-data' / 'chat'} "
        f"does not exist (a relative url is read from the plan file's folder, {folder})\n")
