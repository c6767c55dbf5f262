"""The repository's layout rules, checked statically on the source tree.

Why: mdata's processes are split on purpose. Constructor and loader workers import only the pure
core (no torch, no ``distributed``), the Planner (``scheduler_plugins``) and the workers
(``workers``) run in Dask processes the trainer and driver never load, and import circles make
start-up order fragile. Nothing at runtime checks this, so one stray import would quietly put torch
into every worker. This test parses every module with :mod:`ast` (imports inside functions count:
they run too, only later) and fails with every violation listed at once:

1. an import circle among the project's modules (``mdata``, ``scheduler_plugins``, ``workers``,
   ``benchmarks``), with its path. Imports inside functions and under ``if TYPE_CHECKING:``
   count: a circle broken only by importing late, or only for the type checker, is still two
   modules that need each other (a helper that takes the whole composite should be passed the
   parts it uses, or the shared piece should move into a third module both import);
2. the pure core (``mdata`` outside its homes, see :data:`HOMES`) importing ``distributed``,
   ``dask.distributed``, ``torch``, ``scheduler_plugins`` or ``workers``; plain ``dask`` (say
   ``dask.config`` in ``mdata.config``) is allowed;
3. any ``mdata`` module, homes included, importing ``scheduler_plugins`` or ``workers`` (they run
   in other processes);
4. a file over its folder's limit (:data:`SIZE_LIMITS`: :data:`MAX_LINES` lines in ``mdata/``,
   :data:`RUNTIME_MAX_LINES` in ``scheduler_plugins/`` and ``workers/``; except the example
   data-set builder);
5. a comment, docstring or string citing ``DESIGN.md``, a document that is not in the repository;
6. a project module importing a compatibility alias (:data:`ALIASES`): those old paths are kept
   for users' scripts, the project's own code imports the new homes.

Imports under ``if TYPE_CHECKING:`` never run, so they are left out of rules 2, 3 and 6 (they load
nothing into any process), not out of rule 1.

The walker is small pure functions (source text in, facts out); the synthetic tests at the top show
that each check does fail on a violation, the tests at the bottom apply them to the repository.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[2]

#: Top-level packages whose modules form the import graph.
PROJECT = ("mdata", "scheduler_plugins", "workers", "benchmarks")

#: Modules under ``mdata`` that are not the pure core: the trainer side (may import torch and
#: distributed), the driver side, the wire (may use distributed's protocol), the two
#: compatibility aliases and the command-line entry (which imports the driver lazily).
HOMES = (
    "mdata.trainer", "mdata.driver", "mdata.wire", "mdata.client", "mdata.cluster", "mdata.cli",
)

#: What the pure core never imports: these pull Dask's distributed runtime, torch or the code of
#: other processes into constructor and loader workers.
CORE_FORBIDDEN = ("distributed", "dask.distributed", "torch", "scheduler_plugins", "workers")

#: What no ``mdata`` module imports: the Planner plugin and the worker plugins run in Dask
#: processes of their own.
MDATA_FORBIDDEN = ("scheduler_plugins", "workers")

MAX_LINES = 420
#: The Dask-side runtime folders are held a little tighter: their modules are the ones people
#: read while debugging a live cluster.
RUNTIME_MAX_LINES = 400
#: Folder -> the most lines one of its files may have.
SIZE_LIMITS = {"mdata": MAX_LINES, "scheduler_plugins": RUNTIME_MAX_LINES, "workers": RUNTIME_MAX_LINES}
LONG_FILES_ALLOWED = frozenset({"mdata/data/example.py"})  # the example data-set builder

#: Old import paths kept only for users' scripts (docs, notebooks and the API reference named
#: them); each is a thin re-export of its new home, which the project's own code imports.
ALIASES = (
    "mdata.client", "mdata.cluster", "mdata.dashboard_pages", "mdata.ids", "mdata.pool_layout",
    "mdata.pool_layout_text", "mdata.pool_scaling", "mdata.profile", "mdata.standbys",
)

#: Folders whose Python files may not cite the missing design document.
CITATION_DIRS = ("mdata", "scheduler_plugins", "workers", "benchmarks")
MISSING_DOCUMENT = "DESIGN.md"


# ----------------------------------------------------------------------------------------------
# the walker: pure functions
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    """One import statement: the dotted names it may load, where it is, and what it lists.

    ``target`` is the module named after ``import`` or ``from`` (relative imports resolved);
    ``names`` are the names after ``from ... import`` (empty for a plain ``import``).
    """

    importer: str
    target: str
    names: tuple[str, ...]
    line: int

    def candidates(self) -> tuple[str, ...]:
        """Every dotted name this statement may load: ``from a import b`` may load ``a.b``."""
        return (self.target,) + tuple(f"{self.target}.{n}" for n in self.names if n != "*")


def module_name(relative: PurePosixPath) -> str:
    """``mdata/balance/__init__.py`` -> ``mdata.balance``; ``mdata/cli.py`` -> ``mdata.cli``."""
    parts = list(relative.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute module of ``from <level dots><target> import ...`` written in ``module``."""
    if level == 0:
        return target or ""
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]  # a plain module's dot is its package
    if level - 1 > len(parts) - 1:
        raise ValueError(f"relative import beyond the top-level package in {module}")
    base = parts[: len(parts) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_in(source: str, module: str, is_package: bool, *,
               type_checking: bool = False) -> list[Import]:
    """Every import statement of a module, at any depth (functions, classes, ``try``), in order.

    Statements under ``if TYPE_CHECKING:`` are skipped (they never run) unless ``type_checking``
    (the circle rule counts them); their ``else`` branch is kept.
    """
    found: list[Import] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append(Import(module, alias.name, (), node.lineno))
        elif isinstance(node, ast.ImportFrom):
            target = resolve_relative(module, is_package, node.level, node.module)
            names = tuple(alias.name for alias in node.names)
            found.append(Import(module, target, names, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found


def within(name: str, prefixes: Iterable[str]) -> bool:
    """Whether dotted ``name`` is ``p`` or inside ``p`` for a ``p`` in ``prefixes``."""
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def project_targets(imp: Import, known: frozenset[str]) -> set[str]:
    """The project modules an import loads: ``from pkg import sub`` -> ``pkg.sub`` when that is a
    module, else ``pkg``; ``import a.b.c`` -> the longest known prefix of ``a.b.c``."""
    targets: set[str] = set()
    if imp.names:
        rest = [n for n in imp.names if f"{imp.target}.{n}" not in known]
        targets.update(f"{imp.target}.{n}" for n in imp.names if f"{imp.target}.{n}" in known)
        if rest and imp.target in known:
            targets.add(imp.target)
        return targets
    parts = imp.target.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in known:
            targets.add(".".join(parts[:end]))
            break
    return targets


def import_graph(
    imports: Iterable[Import], known: frozenset[str]
) -> tuple[dict[str, set[str]], dict[tuple[str, str], int]]:
    """Module -> project modules it imports, and the first line of each edge (for messages)."""
    graph: dict[str, set[str]] = {m: set() for m in known}
    lines: dict[tuple[str, str], int] = {}
    for imp in imports:
        for target in project_targets(imp, known):
            if target == imp.importer:
                continue  # ``from pkg import x`` inside pkg/__init__ names its own attribute
            graph[imp.importer].add(target)
            lines.setdefault((imp.importer, target), imp.line)
    return graph, lines


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, each sorted; components in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(components)


def shortest_cycle_through(graph: Mapping[str, Iterable[str]], start: str) -> list[str] | None:
    """The shortest path ``start -> ... -> start`` (breadth first), or None."""
    parent: dict[str, str] = {}
    queue = deque([start])
    seen = {start}
    while queue:
        v = queue.popleft()
        for w in sorted(graph.get(v, ())):
            if w == start:
                path = [v]  # walk back v -> ... -> start, then read it forwards
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return path[::-1] + [start]
            if w not in seen:
                seen.add(w)
                parent[w] = v
                queue.append(w)
    return None


def find_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Import circles as paths ``[a, b, ..., a]``; every module that lies on a circle is on one.

    Per strongly connected component, the shortest circle through its first module not yet
    covered, until all its modules are covered; so each tangle is reported, with concrete paths.
    (A circle through a module never leaves its component, so the search needs no fence.)
    """
    cycles: list[list[str]] = []
    for component in strongly_connected(graph):
        if len(component) == 1 and component[0] not in graph.get(component[0], ()):
            continue
        covered: set[str] = set()
        for start in component:
            if start in covered:
                continue
            cycle = shortest_cycle_through(graph, start)
            if cycle is not None:
                cycles.append(cycle)
                covered.update(cycle)
    return cycles


def describe_cycle(cycle: list[str], lines: Mapping[tuple[str, str], int]) -> str:
    """``a -> b -> a`` with where each step is written: ``a (line 3) -> b (line 9) -> a``."""
    steps = [f"{a} (line {lines.get((a, b), '?')})" for a, b in zip(cycle, cycle[1:])]
    return " -> ".join(steps + [cycle[-1]])


def forbidden_imports(imports: Iterable[Import],
                      rule: Callable[[str], tuple[str, ...]]) -> list[str]:
    """``importer:line imports X`` for each import that loads a name ``rule(importer)`` bans."""
    found = []
    for imp in imports:
        banned = rule(imp.importer)
        hits = [c for c in imp.candidates() if within(c, banned)]
        if hits:
            found.append(f"{imp.importer}:{imp.line} imports {hits[0]} (not allowed: "
                         f"{', '.join(banned)})")
    return found


def layout_rule(module: str) -> tuple[str, ...]:
    """What ``module`` may not import: the core's list, the homes' list, or nothing."""
    if not within(module, ("mdata",)):
        return ()
    if within(module, HOMES):
        return MDATA_FORBIDDEN
    return CORE_FORBIDDEN


def alias_imports(imports: Iterable[Import], aliases: Iterable[str]) -> list[str]:
    """``importer:line imports ALIAS`` for each import of a compatibility alias by a module that
    is not one of the aliases itself."""
    aliases = tuple(aliases)
    found = []
    for imp in imports:
        if within(imp.importer, aliases):
            continue
        hits = [c for c in imp.candidates() if c in aliases]
        if hits:
            found.append(f"{imp.importer}:{imp.line} imports {hits[0]} (a compatibility alias: "
                         "import its new home)")
    return found


def long_files(texts: Mapping[str, str], limits: Mapping[str, int],
               allowed: Iterable[str] = ()) -> list[str]:
    """``path: N lines (limit L)`` for each file over the limit of its top folder (``texts``:
    repository path -> source); folders without a limit and ``allowed`` paths are not checked."""
    allowed = frozenset(allowed)
    found = []
    for path, text in sorted(texts.items()):
        limit = limits.get(PurePosixPath(path).parts[0])
        n = line_count(text)
        if limit is not None and n > limit and path not in allowed:
            found.append(f"{path}: {n} lines (limit {limit})")
    return found


def citations(source: str, needle: str = MISSING_DOCUMENT) -> list[int]:
    """Lines of comments, docstrings and other string literals that mention ``needle``."""
    text_tokens = {tokenize.COMMENT, tokenize.STRING}
    if hasattr(tokenize, "FSTRING_MIDDLE"):  # Python >= 3.12 splits f-strings
        text_tokens.add(tokenize.FSTRING_MIDDLE)
    lines = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in text_tokens:
            # a docstring spans lines: report the line that names the needle
            for k, text in enumerate(tok.string.split("\n")):
                if needle in text:
                    lines.append(tok.start[0] + k)
    return lines


def line_count(source: str) -> int:
    return len(source.splitlines())


# ----------------------------------------------------------------------------------------------
# the checkers know they can fail: a tiny synthetic project
# ----------------------------------------------------------------------------------------------

SYNTHETIC = {
    "pkg/__init__.py": "from pkg.a import A\nfrom . import A as ALIAS\n",
    "pkg/a.py": "from pkg import b\nA = 1\n",
    "pkg/b.py": "import os\n\ndef later():\n    from .c import C\n    return C\n",
    "pkg/c.py": "from pkg.a import A\nC = A\n",
    "pkg/d.py": "from . import a\nimport pkg.c\n",
    "pkg/sub/__init__.py": "from ..a import A\nfrom .leaf import *\n",
    "pkg/sub/leaf.py": (
        "from typing import TYPE_CHECKING\n"
        "import dask.config\n"
        "from dask import distributed\n"
        "if TYPE_CHECKING:\n"
        "    import torch\n"
        "def f():\n"
        "    import torch.nn as nn  # DESIGN.md 9\n"
        "    return nn\n"
    ),
}


def _parsed(files: Mapping[str, str], **options: bool) -> tuple[list[Import], frozenset[str]]:
    """The imports and module names of a synthetic tree (``path -> source``)."""
    imports: list[Import] = []
    names = []
    for path, source in files.items():
        rel = PurePosixPath(path)
        name = module_name(rel)
        names.append(name)
        imports += imports_in(source, name, rel.name == "__init__.py", **options)
    return imports, frozenset(names)


def _synthetic() -> tuple[list[Import], frozenset[str]]:
    return _parsed(SYNTHETIC)


def test_relative_imports_resolve_like_python() -> None:
    assert resolve_relative("pkg.b", False, 1, "c") == "pkg.c"
    assert resolve_relative("pkg.sub", True, 1, "leaf") == "pkg.sub.leaf"
    assert resolve_relative("pkg.sub", True, 2, "a") == "pkg.a"
    assert resolve_relative("pkg.sub.leaf", False, 2, None) == "pkg"
    assert module_name(PurePosixPath("pkg/sub/__init__.py")) == "pkg.sub"


def test_imports_include_function_local_and_skip_type_checking() -> None:
    imports, _ = _synthetic()
    leaf = [(i.target, i.names, i.line) for i in imports if i.importer == "pkg.sub.leaf"]
    assert leaf == [
        ("typing", ("TYPE_CHECKING",), 1),
        ("dask.config", (), 2),
        ("dask", ("distributed",), 3),
        ("torch.nn", (), 7),  # inside a function; line 5 is under TYPE_CHECKING
    ]


def test_graph_resolves_submodules_and_finds_the_cycle_path() -> None:
    imports, known = _synthetic()
    graph, lines = import_graph(imports, known)
    assert graph["pkg"] == {"pkg.a"}  # ``from . import A`` in pkg/__init__ is not a self-import
    assert graph["pkg.a"] == {"pkg.b"}  # ``from pkg import b``: the submodule, not pkg/__init__
    assert graph["pkg.b"] == {"pkg.c"}  # function-local and relative
    assert graph["pkg.d"] == {"pkg.a", "pkg.c"}
    assert graph["pkg.sub"] == {"pkg.a", "pkg.sub.leaf"}
    cycles = find_cycles(graph)
    assert cycles == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    assert describe_cycle(cycles[0], lines) == (
        "pkg.a (line 1) -> pkg.b (line 4) -> pkg.c (line 1) -> pkg.a"
    )


def test_cycle_finder_covers_every_tangle_and_self_imports() -> None:
    graph = {"x": {"y"}, "y": {"x", "z"}, "z": {"y"}, "s": {"s"}, "free": {"x"}}
    cycles = find_cycles(graph)
    assert cycles == [["s", "s"], ["x", "y", "x"], ["z", "y", "z"]]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


#: Circles the old rule did not see: one hidden under TYPE_CHECKING (a helper annotated with the
#: composite that imports it), one hidden in a function (imported late), and a module that reads
#: a name only for the type checker without a circle.
HIDDEN = {
    "q/__init__.py": "",
    "q/state.py": "from q.ticks import on_tick\nfrom q import report\n\nclass State: ...\n",
    "q/ticks.py": (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from q.state import State\n"
        "def on_tick(state: State) -> None: ...\n"
    ),
    "q/report.py": "def table():\n    from q.state import State\n    return State\n",
    "q/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from q.ticks import on_tick\n",
}


def _hidden(type_checking: bool) -> tuple[dict[str, set[str]], dict[tuple[str, str], int]]:
    return import_graph(*_parsed(HIDDEN, type_checking=type_checking))


def test_the_circle_rule_counts_imports_for_the_type_checker_and_in_functions() -> None:
    graph, _ = _hidden(type_checking=False)
    assert find_cycles(graph) == [["q.report", "q.state", "q.report"]]  # the function-level one
    graph, lines = _hidden(type_checking=True)
    cycles = find_cycles(graph)
    assert cycles == [["q.report", "q.state", "q.report"], ["q.ticks", "q.state", "q.ticks"]]
    assert describe_cycle(cycles[1], lines) == "q.ticks (line 4) -> q.state (line 1) -> q.ticks"
    assert graph["q.typed"] == {"q.ticks"}  # counted, but no circle: fine


def test_imports_of_a_compatibility_alias_are_reported_outside_the_alias() -> None:
    sources = {
        "pkg/old.py": "from pkg.new import X\n",  # the alias itself re-exports its new home
        "pkg/new.py": "X = 1\n",
        "pkg/user.py": "import os\n\ndef f():\n    from pkg.old import X\n    return X\n",
        "pkg/fine.py": "from pkg.new import X\n",
    }
    imports = [i for path, src in sources.items()
               for i in imports_in(src, module_name(PurePosixPath(path)), False)]
    assert alias_imports(imports, ["pkg.old"]) == [
        "pkg.user:4 imports pkg.old (a compatibility alias: import its new home)"]


def test_files_over_their_folders_limit_are_reported() -> None:
    texts = {"scheduler_plugins/big.py": "x = 1\n" * 401, "workers/ok.py": "x = 1\n" * 400,
             "mdata/roomy.py": "x = 1\n" * 401, "mdata/data/example.py": "x = 1\n" * 900,
             "benchmarks/sweep.py": "x = 1\n" * 900}
    assert long_files(texts, SIZE_LIMITS, LONG_FILES_ALLOWED) == [
        "scheduler_plugins/big.py: 401 lines (limit 400)"]
    assert long_files({"mdata/huge.py": "x = 1\n" * 421}, SIZE_LIMITS) == [
        "mdata/huge.py: 421 lines (limit 420)"]


def test_forbidden_imports_are_reported_and_plain_dask_is_not() -> None:
    imports, _ = _synthetic()
    found = forbidden_imports(imports, lambda m: CORE_FORBIDDEN)
    assert found == [
        "pkg.sub.leaf:3 imports dask.distributed (not allowed: distributed, dask.distributed, "
        "torch, scheduler_plugins, workers)",
        "pkg.sub.leaf:7 imports torch.nn (not allowed: distributed, dask.distributed, torch, "
        "scheduler_plugins, workers)",
    ]
    assert layout_rule("mdata.balance.step") == CORE_FORBIDDEN
    assert layout_rule("mdata.trainer.loader") == MDATA_FORBIDDEN
    assert layout_rule("mdata.cli") == MDATA_FORBIDDEN
    assert layout_rule("mdata.clients") == CORE_FORBIDDEN  # a prefix of a name is not a home
    assert layout_rule("workers.loader") == ()


def test_citations_find_comments_and_docstrings_only_where_they_are() -> None:
    source = '"""Why.\n\nSee DESIGN.md."""\nx = 1\n# DESIGN.md section 2\ny = "fine"\n'
    assert citations(source) == [3, 5]
    assert citations(SYNTHETIC["pkg/sub/leaf.py"]) == [7]
    assert citations("DESIGN = 1\nmd = DESIGN\n") == []


# ----------------------------------------------------------------------------------------------
# the repository
# ----------------------------------------------------------------------------------------------


def _python_files(*folders: str) -> list[PurePosixPath]:
    files = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = PurePosixPath(path.relative_to(ROOT).as_posix())
            if "__pycache__" not in rel.parts:
                files.append(rel)
    return files


def _repository_imports(type_checking: bool = False) -> tuple[list[Import], frozenset[str]]:
    imports: list[Import] = []
    names = []
    for rel in _python_files(*PROJECT):
        name = module_name(rel)
        names.append(name)
        imports += imports_in((ROOT / rel).read_text(), name, rel.name == "__init__.py",
                              type_checking=type_checking)
    return imports, frozenset(names)


def _report(title: str, violations: list[str]) -> str:
    return f"{len(violations)} {title}:\n  " + "\n  ".join(violations)


def test_walker_reads_the_repository() -> None:
    """The checks below pass only if they saw the code: the walker finds known modules and the
    homes' own imports of torch and distributed (allowed there), and plain dask in the core."""
    imports, known = _repository_imports()
    assert {"mdata", "mdata.balance", "mdata.config", "scheduler_plugins.planner",
            "workers.loader", "mdata.trainer.tensors", "mdata.wire.frames"} <= known
    seen = {(i.importer, c) for i in imports for c in i.candidates()}
    assert ("mdata.trainer.tensors", "torch") in seen
    assert ("mdata.wire.frames", "distributed.protocol") in seen
    assert ("mdata.config", "dask.config") in seen
    graph, _ = import_graph(imports, known)
    assert "mdata.balance.step" in graph["mdata.balance"]


def test_no_import_circles() -> None:
    imports, known = _repository_imports(type_checking=True)
    graph, lines = import_graph(imports, known)
    cycles = [describe_cycle(c, lines) for c in find_cycles(graph)]
    assert not cycles, _report("import circle(s) among the project's modules (function-local "
                               "imports and imports under TYPE_CHECKING count)", cycles)


def test_pure_core_and_homes_import_only_what_their_process_has() -> None:
    imports, _ = _repository_imports()
    found = forbidden_imports(imports, layout_rule)
    assert not found, _report(
        "forbidden import(s): the pure core (mdata outside " + ", ".join(HOMES) + ") never "
        "imports distributed, torch or other processes' code; no mdata module imports "
        "scheduler_plugins or workers", found)


def test_files_stay_small() -> None:
    texts = {str(rel): (ROOT / rel).read_text() for rel in _python_files(*SIZE_LIMITS)}
    assert len(texts) > 100  # the walk saw the folders
    long = long_files(texts, SIZE_LIMITS, LONG_FILES_ALLOWED)
    assert not long, _report("file(s) over their folder's limit; split them into modules with "
                             "one job each", long)


def test_no_project_module_imports_a_compatibility_alias() -> None:
    imports, known = _repository_imports()
    assert set(ALIASES) <= known  # each alias still exists (tests/unit/test_documented_imports.py)
    found = alias_imports(imports, ALIASES)
    assert not found, _report("import(s) of a compatibility alias; the old paths are kept for "
                              "users, the project imports the new homes", found)


def test_no_citations_of_the_missing_design_document() -> None:
    found = []
    for rel in _python_files(*CITATION_DIRS):
        found += [f"{rel}:{line}" for line in citations((ROOT / rel).read_text())]
    assert not found, _report(f"comment(s) or docstring(s) citing {MISSING_DOCUMENT}, which is "
                              "not in the repository; say what is meant instead (or point to "
                              "docs/)", found)
