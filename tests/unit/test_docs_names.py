"""Every mdata name the documentation mentions exists: a reader who copies it gets no ImportError.

The pages (docs/**/*.md, README.md) and the notebooks (markdown and code cells) name mdata's API
three ways: a backticked dotted name (`mdata.trainer.Loader`, `mdata.planner.simulate(...)`),
an import line (`from mdata.sources import Source, TokenizeText`) and a plan file's reference to
code (`type: mdata.sources.transforms:TokenizeText`). Each must import: the module, then each
attribute after it. A backticked `mdata.section.key` may instead be a configuration key, which
must then be one of mdata.yaml's (`mdata.trainer.timeout`; a glob such as `mdata.storage.*` names
a section). Renaming or moving a public name fails here, naming the page that still says it.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

#: A dotted name at the start of a word: mdata, then .segments (config keys have hyphens, globs *),
#: optionally :Name (a plan file's reference to code). Not part of a path (mdata/mdata.yaml).
DOTTED = re.compile(r"(?<![\w/.-])mdata(?:\.[\w*-]+)+(?::\w+)?")
REFERENCE = re.compile(r"(?<![\w/.-])mdata(?:\.\w+)+:\w+")
FROM_IMPORT = re.compile(r"^\s*from (mdata(?:\.\w+)*) import \(?([\w ,]+)\)?\s*(?:#.*)?$", re.M)
PLAIN_IMPORT = re.compile(r"^\s*import (mdata(?:\.\w+)*)(?: as \w+)?\s*(?:#.*)?$", re.M)
FILE_SUFFIXES = (".yaml", ".py", ".md", ".json")


def documents() -> dict[str, str]:
    """Each page's and notebook's text (a notebook's cells joined), by path from the root."""
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "docs").rglob("*.md"))}
    texts["README.md"] = (ROOT / "README.md").read_text()
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        texts[str(nb.relative_to(ROOT))] = "\n".join("".join(cell["source"]) for cell in cells)
    return texts


def mentioned(text: str) -> set[tuple[str, tuple[str, ...]]]:
    """(dotted name or module, imported names) for every mention of mdata's API in ``text``."""
    found: set[tuple[str, tuple[str, ...]]] = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        found |= {(name, ()) for name in DOTTED.findall(span) if not name.endswith(FILE_SUFFIXES)}
    found |= {(name, ()) for name in REFERENCE.findall(text)}
    for module, names in FROM_IMPORT.findall(text):
        found.add((module, tuple(n.split(" as ")[0].strip() for n in names.split(",") if n.strip())))
    found |= {(module, ()) for module in PLAIN_IMPORT.findall(text)}
    return found


def config_keys() -> set[str]:
    """Every section and key of mdata's defaults, dotted: ``mdata.trainer``, ``mdata.trainer.timeout``."""
    keys: set[str] = set()

    def walk(prefix: str, node: object) -> None:
        keys.add(prefix)
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}.{key}", value)

    walk("mdata", yaml.safe_load((ROOT / "mdata" / "mdata.yaml").read_text())["mdata"])
    return keys


def resolves(dotted: str) -> bool:
    """Whether ``a.b.c`` (or ``a.b:c``) is a module, or an attribute chain of the longest
    importable module prefix."""
    module_part, _, attribute = dotted.partition(":")
    parts = module_part.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:] + ([attribute] if attribute else []):
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


def is_config_key(dotted: str, keys: set[str]) -> bool:
    name = dotted.removesuffix(".*")
    return "*" not in name and ":" not in dotted and name in keys


def unresolved(texts: dict[str, str], keys: set[str]) -> list[str]:
    problems = []
    for page, text in texts.items():
        for name, imported in sorted(mentioned(text)):
            if imported:
                bad = [n for n in imported if not resolves(f"{name}.{n}")]
                if not resolves(name) or bad:
                    problems.append(f"{page}: from {name} import {', '.join(bad) or '...'}")
            elif not (is_config_key(name, keys) or resolves(name)):
                problems.append(f"{page}: {name}")
    return problems


def test_the_scanner_finds_each_form_and_flags_what_does_not_exist():
    text = """Use `mdata.trainer.Loader` and `mdata.planner.simulate(plan)`; set `mdata.trainer.timeout`
or `mdata.storage.*`; not `mdata.trainer.no_such_loader` nor `mdata.nowhere.timeout`.
The defaults live in `mdata/mdata.yaml`.

```python
from mdata.sources import Source, NoSuchTransform
import mdata.no_such_module
```

```yaml
transform: {type: mdata.sources.transforms:TokenizeText, args: {}}
cost: {type: mdata.cost:NoSuchCost}
```
"""
    found = {name for name, _ in mentioned(text)}
    assert "mdata/mdata.yaml" not in found and "mdata.yaml" not in found
    assert sorted(unresolved({"page.md": text}, config_keys())) == [
        "page.md: from mdata.sources import NoSuchTransform",
        "page.md: mdata.cost:NoSuchCost",
        "page.md: mdata.no_such_module",
        "page.md: mdata.nowhere.timeout",
        "page.md: mdata.trainer.no_such_loader",
    ]


def test_every_mdata_name_the_docs_and_notebooks_mention_imports():
    texts = documents()
    assert {"README.md", "docs/getting-started.md", "notebooks/explore_plan.ipynb"} <= set(texts)
    total = sum(len(mentioned(text)) for text in texts.values())
    assert total > 80  # the scanner sees the docs' names (about a hundred today)
    problems = unresolved(texts, config_keys())
    if problems:
        pytest.fail("names the docs mention that do not exist:\n" + "\n".join(problems))
