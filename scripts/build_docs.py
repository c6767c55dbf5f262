"""Build the API reference of mdata's public modules from their docstrings, with pdoc.

    .venv/bin/python scripts/build_docs.py                # into build/api/ (open index.html)
    .venv/bin/python scripts/build_docs.py --out DIR

pdoc comes with the ``dev`` extra. The build fails (exit status 1), naming each problem, on a
module that does not import, on any warning pdoc gives while it reads or renders a module, and on
a public class, function or method without a docstring: a reference with holes is worse than
none, because readers stop trusting it. ``tests/unit/test_api_docs.py`` runs this build.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: The modules a user imports (README, docs/getting-started.md, docs/batch.md); a package's page
#: lists what its ``__all__`` exports.
PUBLIC_MODULES = (
    "mdata",
    "mdata.plan",
    "mdata.spec",
    "mdata.sources",
    "mdata.mesh",
    "mdata.cost",
    "mdata.mixing",
    "mdata.batch",
    "mdata.trainer",
    "mdata.trainer.tensors",
    "mdata.driver",
    "mdata.planner",
    "mdata.metadata",
    "mdata.pools",
    "mdata.checkpoint",
    "mdata.lineage.ids",
    "mdata.errors",
)


def resolve_lazy_exports(name: str) -> None:
    """Import what a module exports lazily (a module ``__getattr__``, as ``mdata.sources`` has to
    keep pyarrow out of processes that never read data): pdoc reads a module's namespace and
    would report every such name as one that does not resolve."""
    module = importlib.import_module(name)
    for export in getattr(module, "__all__", ()):
        getattr(module, export)


def _public(name: str) -> bool:
    return not name.startswith("_")


def undocumented(module) -> list[str]:
    """Public classes and functions of a pdoc ``Module`` without a docstring, and public methods
    of its classes (inherited docstrings count), by qualified name."""
    from pdoc.doc import Class, Function

    missing = []
    for member in module.members.values():
        if not _public(member.name) or not isinstance(member, (Class, Function)):
            continue
        if not member.docstring.strip():
            missing.append(f"{module.fullname}.{member.qualname}")
        if isinstance(member, Class):
            for method in member.own_members:
                if (isinstance(method, Function) and _public(method.name)
                        and not method.docstring.strip()):
                    missing.append(f"{module.fullname}.{method.qualname}")
    return missing


def build(out: Path, modules: Sequence[str] = PUBLIC_MODULES) -> list[str]:
    """Render ``modules`` into ``out`` and return the problems found (empty: a clean build)."""
    import pdoc
    import pdoc.doc

    problems: list[str] = []
    # collect first: a file the process leaked earlier warns when its cycle is collected, and
    # that warning is not the docs' (in the test suite it came from an earlier test)
    gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        docs = []
        for name in modules:
            try:
                resolve_lazy_exports(name)
            except Exception as exc:  # noqa: BLE001 - reported by name, the build goes on
                problems.append(f"{name}: does not import: {type(exc).__name__}: {exc}")
                continue
            docs.append(name)
            problems.extend(f"{name}: no docstring on public {qualname}"
                            for qualname in undocumented(pdoc.doc.Module.from_name(name)))
        if docs:
            pdoc.pdoc(*docs, output_directory=out)
    problems.extend(f"pdoc warned: {w.message}" for w in caught)
    return problems


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="build mdata's API reference with pdoc")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "api",
                        help="folder to write the HTML into (default: build/api)")
    args = parser.parse_args(None if argv is None else list(argv))
    if str(REPO) not in sys.path:  # this checkout's mdata, as the tests import it
        sys.path.insert(0, str(REPO))
    problems = build(args.out)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"API reference: {len(problems)} problem(s); fix the docstrings named above",
              file=sys.stderr)
        return 1
    print(f"API reference of {len(PUBLIC_MODULES)} modules: {args.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
