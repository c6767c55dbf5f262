"""Tokenizers, created once per process and never pickled.

A transform names its tokenizer by a string (a tiktoken encoding name, or the path or fsspec URL of a
Hugging Face ``tokenizer.json``). The loaded tokenizer (vocabularies of several MB, Rust state) is
built on first use in each process and shared by every transform and thread of that process, so
shipping a Source to a thousand Dask tasks ships a short string, not the vocabulary, and a worker
holds one copy however many chunks it loads.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Sequence

__all__ = ["Tokenizer", "get_tokenizer", "is_tiktoken_name"]

#: Special tokens tried, in order, as the end-of-sequence token of a Hugging Face tokenizer.
_EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]")


@dataclass(frozen=True)
class Tokenizer:
    """A loaded tokenizer: batch encoding without special tokens, plus its EOS id (if any)."""

    name: str
    encode_batch: Callable[[Sequence[str]], list[list[int]]]
    eos_id: int | None
    vocab_size: int


def is_tiktoken_name(spec: str) -> bool:
    """True when ``spec`` names a tiktoken encoding registered in this environment."""
    import tiktoken

    return spec in tiktoken.list_encoding_names()


_lock = threading.Lock()
_loaded: dict[tuple[str, str | None, int], Tokenizer] = {}


def get_tokenizer(spec: str, *, eos_token: str | None = None, num_threads: int = 1) -> Tokenizer:
    """The process-wide tokenizer for ``spec``, loading it on first use (thread-safe).

    Raises FileNotFoundError / ValueError / KeyError when the spec cannot be loaded; callers that
    know the source wrap these into an error naming it.
    """
    key = (spec, eos_token, num_threads)
    tok = _loaded.get(key)
    if tok is None:
        with _lock:  # two Dask threads may start on the same source at once: load once
            tok = _loaded.get(key)
            if tok is None:
                tok = _load(spec, eos_token, num_threads)
                _loaded[key] = tok
    return tok


def _load(spec: str, eos_token: str | None, num_threads: int) -> Tokenizer:
    if is_tiktoken_name(spec):
        return _load_tiktoken(spec, eos_token, num_threads)
    return _load_hf(spec, eos_token)


def _load_tiktoken(spec: str, eos_token: str | None, num_threads: int) -> Tokenizer:
    import tiktoken

    enc = tiktoken.get_encoding(spec)
    if eos_token is None:
        eos_id = enc.eot_token
    else:
        eos_id = enc.encode_single_token(eos_token)

    if num_threads > 1:
        def encode_batch(texts: Sequence[str]) -> list[list[int]]:
            return enc.encode_ordinary_batch(list(texts), num_threads=num_threads)
    else:
        # One thread: a plain loop avoids creating a thread pool per chunk; Dask supplies the
        # parallelism (one load task per worker thread), so per-task threads would oversubscribe.
        encode = enc.encode_ordinary

        def encode_batch(texts: Sequence[str]) -> list[list[int]]:
            return [encode(t) for t in texts]

    return Tokenizer(name=spec, encode_batch=encode_batch, eos_id=eos_id, vocab_size=enc.n_vocab)


def _load_hf(spec: str, eos_token: str | None) -> Tokenizer:
    import fsspec
    from tokenizers import Tokenizer as HFTokenizer

    with fsspec.open(spec, "r", encoding="utf-8") as f:
        tok = HFTokenizer.from_str(f.read())
    if eos_token is not None:
        eos_id = tok.token_to_id(eos_token)
        if eos_id is None:
            raise KeyError(f"tokenizer {spec!r} has no token {eos_token!r}")
    else:
        eos_id = next(
            (i for i in (tok.token_to_id(c) for c in _EOS_CANDIDATES) if i is not None), None
        )

    # encode_batch_fast skips computing character offsets, which we never use.
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)

    def encode_batch(texts: Sequence[str]) -> list[list[int]]:
        # No special tokens (no [CLS]/[SEP] around each document): EOS is appended by the transform.
        return [e.ids for e in encode(list(texts), add_special_tokens=False)]

    return Tokenizer(
        name=spec, encode_batch=encode_batch, eos_id=eos_id, vocab_size=tok.get_vocab_size()
    )
