"""The API reference builds from the docstrings (scripts/build_docs.py, pdoc), and the build
names what it cannot document: a module that does not import, a public name without a docstring."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build_docs.py"


def _build_docs():
    spec = importlib.util.spec_from_file_location("build_docs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_public_modules_build_without_a_problem(tmp_path):
    build_docs = _build_docs()
    assert build_docs.build(tmp_path) == []
    assert (tmp_path / "index.html").is_file()
    for name in build_docs.PUBLIC_MODULES:
        assert (tmp_path / (name.replace(".", "/") + ".html")).is_file(), name
    loader = (tmp_path / "mdata" / "trainer.html").read_text()
    assert "Iterate over the batches of one trainer rank" in loader  # the Loader's docstring
    sources = (tmp_path / "mdata" / "sources.html").read_text()
    assert "TokenizeText" in sources  # exported lazily, documented all the same


def test_the_build_names_a_missing_docstring_and_a_module_that_does_not_import(tmp_path,
                                                                               monkeypatch):
    (tmp_path / "apidoc_holes.py").write_text(
        '"""A module with holes."""\n\n'
        "def undocumented(x):\n    return x\n\n\n"
        'class Shape:\n    """Documented."""\n\n    def area(self):\n        return 0\n\n'
        '    def _private(self):\n        return 1\n')
    (tmp_path / "apidoc_broken.py").write_text('"""Broken."""\nimport no_such_module_here\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        problems = _build_docs().build(tmp_path / "out", modules=("apidoc_holes", "apidoc_broken"))
    finally:
        sys.modules.pop("apidoc_holes", None)
        sys.modules.pop("apidoc_broken", None)
    assert "apidoc_holes: no docstring on public apidoc_holes.undocumented" in problems
    assert "apidoc_holes: no docstring on public apidoc_holes.Shape.area" in problems
    assert not any("_private" in p for p in problems)
    assert any(p.startswith("apidoc_broken: does not import: ModuleNotFoundError") for p in problems)
    assert (tmp_path / "out" / "apidoc_holes.html").is_file()  # the rest is built all the same
