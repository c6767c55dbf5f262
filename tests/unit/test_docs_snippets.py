"""The docs' snippets, checked as the pages show them: a plan a page shows loads and validates
with mdata's own plan reader against the example corpus, Python compiles and imports what it
imports, and every plan file a command names exists.

A newcomer copies what a page shows; a plan that names a module nobody can import, or a file that
is not in the repository, costs them the first hour. So every fenced ``yaml`` and ``python`` block
of README.md and docs/ is checked here, and the plan files shipped in docs/examples/ are run. A
block may carry one marker, an HTML comment on the line before its fence (invisible on the
rendered page):

- ``<!-- file: PATH -->``: the block is the file PATH (from the repository root), character for
  character, so the page cannot drift from what ships; the file is checked as a plan below;
- ``<!-- plan of: PATH -->``: Python that builds ``plan``, the same plan as the plan file PATH: it
  runs, and the two specs must be equal;
- ``<!-- fragment -->``: a piece on purpose (one entry of a plan's sources, a class without its
  module): YAML is parsed and Python compiled, nothing more;
- ``<!-- needs: MODULE, ... -->``: Python using modules mdata's environment does not install
  (``dask_kubernetes``): compiled, and its other imports checked.

An unmarked YAML block that is a plan (a mapping with ``sources``) must run as written: it is
loaded as a plan file saved at the repository root. Python runs from the repository root with
``docs/examples`` importable, as the pages' snippets say.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from fixtures_plans import EXAMPLES, REPO, examples_copy, shipped_plans  # noqa: F401

from mdata.metadata import read_metadata
from mdata.plan import Plan
from mdata.planner import simulate
from mdata.pools.profile import default_profile_path
from mdata.sources import list_shards

PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "docs").glob("*/*.md")])
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[ \t]*$")
_WRITES_PLAN = re.compile(r"""\.to_file\(["']([^"']+\.ya?ml)["']\)""")
_MARKER = re.compile(r"^\s*<!--\s*(file|plan of|fragment|needs)\s*:?\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: its language, text and marker."""

    page: str
    line: int
    lang: str
    text: str
    marker: str | None = None
    argument: str = ""

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def blocks_of(page: Path) -> Iterator[Block]:
    """The fenced blocks of ``page`` (indented ones inside lists too), with the marker on the
    line before each, if any."""
    lines = page.read_text(encoding="utf-8").splitlines()
    name = str(page.relative_to(REPO))
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        assert end is not None, f"{name}:{i + 1}: a fence that is never closed"
        indent = len(fence["indent"])
        text = "".join(line[indent:] + "\n" for line in lines[i + 1:end])
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = _MARKER.match(before)
        yield Block(name, i + 1, fence["lang"], text, marker and marker[1], marker[2] if marker else "")
        i = end + 1


BLOCKS = [b for page in PAGES for b in blocks_of(page)]
YAML = [b for b in BLOCKS if b.lang in ("yaml", "yml")]
PYTHON = [b for b in BLOCKS if b.lang == "python"]


def _is_plan(data: object) -> bool:
    return isinstance(data, dict) and ("sources" in data or "mdata_plan" in data)


@pytest.fixture
def isolated_imports(monkeypatch):
    """sys.path as it was and no ``my_job`` imported, before and after: each test finds the
    examples' module only the way it says it does."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = sys.modules.pop("my_job", None)
    yield
    sys.modules.pop("my_job", None)
    if before is not None:
        sys.modules["my_job"] = before


def test_the_pages_have_the_snippets_this_checks():
    """The extraction itself works: the pages' known blocks are found, markers included."""
    pages = {b.page for b in BLOCKS}
    assert {"README.md", "docs/getting-started.md", "docs/plan-files.md", "docs/deploying.md"} <= pages
    assert len(YAML) >= 4 and len(PYTHON) >= 10
    assert {b.marker for b in BLOCKS} >= {"file", "fragment", "needs", "plan of"}
    shown = {b.argument for b in BLOCKS if b.marker == "file"}
    assert "docs/examples/job.yaml" in shown


@pytest.mark.parametrize("block", YAML, ids=str)
def test_a_yaml_block_parses_and_a_plan_in_it_runs(block, examples_copy, isolated_imports,
                                                   monkeypatch):
    docs = list(yaml.safe_load_all(block.text))
    assert docs, f"{block}: an empty YAML block"
    if block.marker == "file":
        shipped = REPO / block.argument
        assert shipped.is_file(), f"{block} shows {block.argument}, which is not in the repository"
        assert block.text == shipped.read_text(encoding="utf-8"), (
            f"{block} differs from {block.argument}: show the file as it ships")
        return
    if block.marker == "fragment" or not _is_plan(docs[0]):
        return  # a piece on purpose, or YAML that is no plan (a manifest, a configuration)
    assert len(docs) == 1, f"{block}: a plan file holds one YAML document"
    root = examples_copy.parents[1]  # the copy of the repository's layout, with example-data/
    path = root / f"snippet-{block.page.replace('/', '-')}-{block.line}.yaml"
    path.write_text(block.text, encoding="utf-8")
    monkeypatch.syspath_prepend(str(examples_copy))
    _check_runs(Plan.from_file(path), root, block)


def _check_runs(plan: Plan, root: Path, what: object) -> None:
    """``plan`` validates; its sources on the example corpus list their shards, and when all of
    them are there it plans two steps on their real samples."""
    plan.validate()
    corpus = [s for s in plan.sources if Path(s.url).is_relative_to(root)]
    for source in corpus:
        assert list_shards(source).shards, f"{what}: source {source.name!r} lists no shard"
    if len(corpus) == len(plan.sources):
        result = simulate(plan, 2, read_metadata(plan.sources, max_rows_per_shard=16))
        assert set(result.names) == {s.name for s in plan.sources}


@pytest.mark.parametrize("block", PYTHON, ids=str)
def test_a_python_block_compiles_and_imports_what_it_imports(block, isolated_imports, monkeypatch):
    try:
        tree = ast.parse(block.text, filename=str(block))
    except SyntaxError as exc:
        pytest.fail(f"{block} does not compile: {exc}")
    if block.marker == "fragment":
        return
    monkeypatch.syspath_prepend(str(EXAMPLES))
    missing = {m.strip() for m in block.argument.split(",")} if block.marker == "needs" else set()
    for module, name in _imports(tree):
        if module.split(".")[0] in missing:
            continue
        try:
            imported = importlib.import_module(module)
            if name is not None and not hasattr(imported, name):
                importlib.import_module(f"{module}.{name}")
        except ImportError as exc:
            pytest.fail(f"{block}: {'from ' + module + ' ' if name else ''}import {name or module} fails: {exc}")
    if block.marker == "plan of":
        monkeypatch.chdir(REPO)
        namespace: dict = {}
        exec(compile(tree, str(block), "exec"), namespace)
        expected = Plan.from_file(REPO / block.argument).to_spec()
        assert namespace["plan"].to_spec() == expected, f"{block} is not the plan of {block.argument}"


def _imports(tree: ast.AST) -> Iterator[tuple[str, str | None]]:
    """(module, name) of every absolute import in ``tree``; name None for ``import module``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                yield node.module, alias.name


@pytest.mark.parametrize("shipped", shipped_plans(), ids=lambda p: p.name)
def test_a_shipped_plan_file_runs_from_another_directory(shipped, examples_copy, isolated_imports,
                                                         tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    copy = examples_copy / shipped.name
    plan = Plan.from_file(copy)
    _check_runs(plan, examples_copy.parents[1], shipped.name)
    for source in plan.sources:  # a module of its own imports from beside it, not the checkout
        module = sys.modules[type(source.transform).__module__]
        if not module.__name__.startswith("mdata."):
            assert Path(module.__file__).parent == examples_copy, (source.name, module.__file__)
    assert any(f"docs/examples/{shipped.name}" in page.read_text(encoding="utf-8") for page in PAGES), (
        f"no page shows or names docs/examples/{shipped.name}")


def test_the_getting_started_plan_file_is_the_plan_my_job_builds(isolated_imports, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    from my_job import my_plan, my_sources

    built = my_plan(my_sources("/tmp/mdata-quickstart"), dp=2)  # serve.py's default data folder
    read = Plan.from_file(EXAMPLES / "job.yaml")
    assert read.to_spec() == built.to_spec() and read.fingerprint() == built.fingerprint()


_COMMAND_PLAN = re.compile(r"(?:mdata\s+(?:plan\s+(?:show|simulate|layout)|profile)|--plan)\s+"
                           r"([\w./-]+\.(?:ya?ml|json))")
_PROFILE_OF = re.compile(r"(?:--plan|plan\s+layout)\s+([\w./-]+\.ya?ml)[^\n`]*?--profile\s+([\w./-]+)")


def test_every_plan_file_a_command_names_exists_and_its_profile_is_where_mdata_profile_writes_it():
    named = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        written = set(_WRITES_PLAN.findall(text))  # plans the page's own Python writes first
        for found in _COMMAND_PLAN.finditer(text):
            named.append(found[1])
            assert found[1] in written or (REPO / found[1]).is_file(), (
                f"{page.relative_to(REPO)} runs a command on {found[1]}, which is not in the repository")
        for found in _PROFILE_OF.finditer(text):
            assert found[2] == str(default_profile_path(found[1])), (
                f"{page.relative_to(REPO)}: `mdata profile {found[1]}` writes "
                f"{default_profile_path(found[1])}, not {found[2]}")
    assert "docs/examples/text.yaml" in named and "docs/examples/vlm.yaml" in named
