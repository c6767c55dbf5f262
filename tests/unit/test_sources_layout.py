"""The layering of mdata.sources: value types below their consumers, and no import circle.

Imports are read from the source (module level and inside functions alike; ``if TYPE_CHECKING:``
blocks excluded, since they never run), so a lazy import that closes a circle fails here too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mdata.sources

PACKAGE = Path(mdata.sources.__file__).parent
PREFIX = "mdata.sources."


def _runtime_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            skipped.update(id(n) for n in ast.walk(node))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PREFIX):
            found.add(node.module[len(PREFIX):].split(".")[0])
        elif isinstance(node, ast.Import):
            found.update(a.name[len(PREFIX):].split(".")[0] for a in node.names if a.name.startswith(PREFIX))
    return found


def _graph() -> dict[str, set[str]]:
    return {p.stem: _runtime_imports(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}


def test_no_import_circle_among_the_sources_modules():
    graph = _graph()
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        for dep in sorted(graph.get(module, ())):
            assert dep not in path, f"import circle: {' -> '.join(path + (dep,))}"
            if dep not in done:
                visit(dep, path + (dep,))
        done.add(module)

    for module in sorted(graph):
        visit(module, (module,))


def test_value_types_do_not_import_their_consumers():
    graph = _graph()
    consumers = {"listing", "cache", "load", "readers", "shard_reader", "parquet_reader", "jsonl_reader",
                 "retry"}
    for value_module in ("spec", "shards", "chunk", "fields"):
        assert not graph[value_module] & consumers, (value_module, graph[value_module])


def test_no_module_of_the_package_is_over_400_lines():
    sizes = {p.name: len(p.read_text().splitlines()) for p in PACKAGE.glob("*.py")}
    assert max(sizes.values()) <= 400, sizes
