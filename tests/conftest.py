"""Shared pytest fixtures for the whole suite."""

from fixtures_corpus import example_corpus  # noqa: F401  (the small example corpus, built once per session)
