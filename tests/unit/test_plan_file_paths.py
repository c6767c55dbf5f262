"""What is relative in a plan file is relative to the file, never to the reader's working
directory: its relative source urls, a module it names beside it, and the profile `mdata profile`
writes for it. Every test reads the plan from another directory than the plan's own."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from mdata.cli import main
from mdata.errors import SourceNotFoundError
from mdata.plan import Plan
from mdata.sources import TokenizeText, list_shards
from mdata.spec.plan_paths import is_relative_path

PLAN = """\
sources:
- {{name: notes, url: {url}, format: jsonl, chunk_rows: 8{transform}}}
mixture: {{type: static, weights: {{notes: 1.0}}}}
balance: {{micro_batches: 1, max_tokens: 256, global_batch: 4}}
"""


def _notes(folder: Path, shards: int = 2) -> Path:
    folder.mkdir(parents=True)
    for shard in range(shards):
        rows = [json.dumps({"text": f"note {shard}-{i}: " + "words " * (i % 4 + 1)}) for i in range(12)]
        (folder / f"part-{shard}.jsonl").write_text("\n".join(rows) + "\n")
    return folder


def _plan_file(folder: Path, url: str, transform: str = "", name: str = "job.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(PLAN.format(url=url, transform=transform))
    return path


@pytest.fixture
def elsewhere(tmp_path, monkeypatch) -> Path:
    """A working directory that is not the plan's folder (and holds a decoy of its data)."""
    cwd = tmp_path / "elsewhere"
    _notes(cwd / "data")  # what the url would wrongly mean if read from the cwd
    monkeypatch.chdir(cwd)
    return cwd


def test_a_relative_url_is_read_from_the_plan_files_folder(tmp_path, elsewhere):
    data = _notes(tmp_path / "project" / "data", shards=3)
    path = _plan_file(tmp_path / "project" / "plans", "../data/*.jsonl")
    for build in (True, False):
        plan = Plan.from_file(path, build_sources=build)
        assert plan.sources[0].url == str(data / "*.jsonl")
    assert len(list_shards(Plan.from_file(path).sources[0]).shards) == 3  # not the cwd's 2
    relative = Plan.from_file(Path("..") / "project" / "plans" / "job.yaml")  # a relative plan path
    assert relative.sources[0].url == str(data / "*.jsonl")


def test_a_missing_relative_path_names_the_plan_file_and_the_folder_it_looked_in(tmp_path, elsewhere):
    plans = tmp_path / "project" / "plans"
    path = _plan_file(plans, "../data/*.jsonl")
    with pytest.raises(SourceNotFoundError) as missing:
        Plan.from_file(path, build_sources=False)
    assert str(missing.value) == (
        f"source 'notes': plan file '{path}' names '../data/*.jsonl', and "
        f"{tmp_path / 'project' / 'data'} does not exist (a relative url is read from the plan "
        f"file's folder, {plans})")
    (tmp_path / "project" / "data").mkdir()
    with pytest.raises(SourceNotFoundError, match=re.escape(
            f"names '../data/*.jsonl', which matches nothing in {tmp_path / 'project' / 'data'} (")):
        Plan.from_file(path)
    assert main(["plan", "show", str(path)]) == 2  # the command line says the same, in one line


def test_urls_absolute_paths_and_home_paths_are_taken_as_written(tmp_path, elsewhere):
    for url in ("s3://bucket/notes/*.jsonl", "file:///nowhere/*.jsonl", "simplecache::s3://b/x.jsonl",
                "/nowhere/notes/*.jsonl", "~/notes/*.jsonl"):
        assert not is_relative_path(url)
        path = _plan_file(tmp_path / "plans", url)
        assert Plan.from_file(path, build_sources=False).sources[0].url == url  # checked when listed
    assert is_relative_path("notes/*.jsonl") and is_relative_path("./notes") and is_relative_path("../x")


@pytest.fixture
def beside_module(tmp_path, monkeypatch):
    """A transform module beside a plan file, under a name nothing else imports; sys.path and
    sys.modules are restored afterwards."""
    name = "mdata_test_beside_plan"
    plans = tmp_path / "project"
    plans.mkdir()
    (plans / f"{name}.py").write_text(
        "from dataclasses import dataclass\n"
        "from mdata.sources import TokenizeText\n\n"
        "@dataclass(frozen=True)\n"
        "class Shouted(TokenizeText):\n"
        "    def transform_sample(self, values):\n"
        "        return super().transform_sample({k: str(v).upper() for k, v in values.items()})\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield name, plans
    sys.modules.pop(name, None)


def test_a_module_beside_the_plan_file_imports(beside_module, elsewhere):
    name, plans = beside_module
    _notes(plans / "data")
    path = _plan_file(plans, "data", f", transform: {{type: '{name}:Shouted', args: {{field: text}}}}")
    assert str(plans) not in sys.path
    transform = Plan.from_file(path).sources[0].transform
    assert type(transform).__module__ == name and isinstance(transform, TokenizeText)
    assert sys.path[-1] == str(plans)  # appended: an installed module of the same name still wins
    Plan.from_file(path)
    assert sys.path.count(str(plans)) == 1


def test_a_plan_naming_no_module_beside_it_leaves_sys_path_alone(tmp_path, elsewhere, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    _notes(tmp_path / "plans" / "data")
    (tmp_path / "plans" / "helpers.py").write_text("")  # beside, but the plan names no such module
    before = list(sys.path)
    Plan.from_file(_plan_file(tmp_path / "plans", "data"))
    assert sys.path == before


def test_mdata_profile_writes_beside_the_plan_file_unless_told(tmp_path, elsewhere, capsys):
    from mdata.pools.profile import Profile, default_profile_path

    _notes(tmp_path / "project" / "data")
    path = _plan_file(tmp_path / "project", "data/*.jsonl", name="notes.yaml")
    assert default_profile_path(path) == tmp_path / "project" / "notes.profile.json"
    assert main(["profile", str(path), "--rows", "8", "--threads", "1"]) == 0
    assert f"wrote {tmp_path / 'project' / 'notes.profile.json'}" in capsys.readouterr().out
    assert Profile.load(tmp_path / "project" / "notes.profile.json").names == ("notes",)
    assert not list(elsewhere.glob("*.profile.json"))
    assert main(["profile", str(path), "--rows", "8", "--threads", "1", "--out", "mine.json"]) == 0
    assert Profile.load(elsewhere / "mine.json").names == ("notes",)  # --out: as given, from the cwd
