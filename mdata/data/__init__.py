"""Data sets that ship with mdata: the real multi-source example corpus (``mdata data example``).

Import from here: :func:`build_example_corpus` builds (or finds) the corpus and returns a
:class:`CorpusReport`; :func:`example_sources` turns a built corpus into ``mdata.sources.Source``
specs ready for a Plan.
"""

from mdata.data.example import CORPUS_VERSION, build_example_corpus, example_sources, read_manifest
from mdata.data.report import CorpusReport, SourceStats

__all__ = [
    "CORPUS_VERSION",
    "CorpusReport",
    "SourceStats",
    "build_example_corpus",
    "example_sources",
    "read_manifest",
]
