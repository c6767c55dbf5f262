"""The shared example corpus fixture: the real small corpus, built once per test session.

Any test can ask for ``example_corpus`` (a :class:`pathlib.Path` to a built ``--size small`` corpus:
chat, scenes, books, code, captions, and docs where the Python docs are installed). Building takes
a few seconds and needs the material ``bash scripts/setup.sh`` downloads; a missing material fails
with a MaterialNotFoundError that says so. Tests must not modify the corpus: copy it first.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mdata.data import build_example_corpus


@pytest.fixture(scope="session")
def example_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("example-corpus")
    build_example_corpus(dest, size="small")
    return dest
