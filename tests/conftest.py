"""Shared pytest fixtures for the whole suite."""

from fixtures_corpus import example_corpus  # noqa: F401  (the small example corpus, built once per session)
from fixtures_sources import moto_s3, store  # noqa: F401  (sources: real text, images, 4 stores)
