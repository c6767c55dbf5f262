"""The plan files shipped in docs/examples/, in a copy of the repository's layout whose
``example-data/`` is the session's example corpus.

The shipped plans read the corpus at ``../../example-data`` from their own folder, which is the
repository root's ``example-data/``: a checkout where the demo ran has it, a fresh one (CI) may
not, and tests must not write into the checkout. So tests read copies of ``docs/examples/`` (the
plans and the modules they name) placed at the same depth under a temporary root whose
``example-data`` is a link to the corpus the session built: the files are checked as shipped, with
the data where they say it is.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "docs" / "examples"


def shipped_plans() -> list[Path]:
    """The plan files of docs/examples/, sorted."""
    return sorted(EXAMPLES.glob("*.yaml"))


def copy_of_examples(root: Path, corpus: Path | None) -> Path:
    """``root/docs/examples/`` holding a copy of every file of docs/examples/, and
    ``root/example-data`` linking to ``corpus`` (left out when None); returns that folder."""
    folder = root / "docs" / "examples"
    folder.mkdir(parents=True)
    for path in EXAMPLES.iterdir():
        if path.is_file():
            shutil.copy2(path, folder / path.name)
    if corpus is not None:
        (root / "example-data").symlink_to(corpus, target_is_directory=True)
    return folder


@pytest.fixture(scope="module")
def examples_copy(example_corpus, tmp_path_factory) -> Path:
    """docs/examples/ copied into a repository layout whose example-data/ is the example corpus."""
    return copy_of_examples(tmp_path_factory.mktemp("checkout"), example_corpus)
