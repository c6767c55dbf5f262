"""docs/batch.md tells the truth: its tables, read from the page, against batches mdata builds.

Real sources (stdlib text as Parquet through the real tokenizer; photographs as Parquet through
``DecodeImageCaption``), real ``load_chunk``, the constructor's own ``build_dp_batch`` with CP=2,
each CP rank's view and the trainer's tensors (``batch_to_torch``). Every field the page lists
must be there with its dtype, shape, padding, stages and CP rule, and nothing it does not list.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures_sources import Store, image_rows, stdlib_texts, write_parquet

from mdata.batch import DPBatch, build_dp_batch, zigzag_indices
from mdata.sources import DecodeImageCaption, Source, TokenizeText, load_chunk
from mdata.sources.chunk import SampleChunk
from mdata.trainer.tensors import batch_to_torch

DOC = Path(__file__).resolve().parents[2] / "docs" / "batch.md"
CP = 2
PAD_ID = 5
IMAGE_TOKEN_ID = 100_277  # one past cl100k's vocabulary, as the demo uses
IMAGE_FIELDS = {"pixels", "image_shapes", "image_token_counts"}


def _rows(lines: list[str], header: int) -> list[dict[str, str]]:
    """The Markdown table whose header row is ``lines[header]``: one dict per row, no backticks."""
    def cells(line: str) -> list[str]:
        return [cell.strip().replace("`", "") for cell in line.strip().strip("|").split("|")]

    names, out = cells(lines[header]), []
    for line in lines[header + 2:]:
        if not line.startswith("|"):
            break
        out.append(dict(zip(names, cells(line))))
    return out


def _table(heading: str) -> list[dict[str, str]]:
    """The first table after the line ``heading``."""
    lines = DOC.read_text().splitlines()
    start = lines.index(heading)
    return _rows(lines, next(i for i in range(start, len(lines)) if lines[i].startswith("|")))


def _table_with_header(header: str) -> list[dict[str, str]]:
    """The table whose header row is ``header``."""
    lines = DOC.read_text().splitlines()
    return _rows(lines, lines.index(header))


FIELDS = {row["field"]: row for row in _table("## Fields of a micro-batch")}


def _ignore_index() -> int:
    match = re.search(r"the \*\*ignore index\*\* is `(-?\d+)`", DOC.read_text())
    assert match, "docs/batch.md no longer states the ignore index"
    return int(match.group(1))


def _shape(expr: str, **sizes: int) -> tuple[int, ...]:
    """``[D + 1]`` with D=3 -> (4,): the page's shape notation, evaluated."""
    return tuple(int(eval(dim, {}, sizes)) for dim in expr.strip("[]").split(","))  # noqa: S307


@pytest.fixture(scope="module")
def chunks(tmp_path_factory):
    """Four text samples and three image-caption samples, loaded as a loader worker loads them."""
    store = Store("local", str(tmp_path_factory.mktemp("batch-doc")))
    write_parquet(store, "text/part-0.parquet", {"text": stdlib_texts(4, max_chars=1500)})
    images, captions = image_rows(3)
    write_parquet(store, "caps/part-0.parquet", {"image": images, "caption": captions})
    text = Source("text", store.url("text/*.parquet"), transform=TokenizeText(field="text"))
    caps = Source("caps", store.url("caps/*.parquet"),
                  transform=DecodeImageCaption(patch_size=16, max_patches=12))
    return load_chunk(text, 0, 0, 4), load_chunk(caps, 0, 0, 3)  # source_index 0 and 1


@pytest.fixture(scope="module")
def dp_batch(chunks) -> DPBatch:
    """Two micro-batches mixing text and images (odd truncated lengths, so CP pads), and an
    empty third one."""
    text, caps = chunks
    text_len = np.minimum(text.num_tokens, [61, 94, 35, 77])
    caps_len = np.minimum(caps.num_tokens, caps.num_patches + [3, 6, 1])
    return build_dp_batch(
        4, 1, [text, caps],
        micro_batch=[0, 1, 0, 1, 0, 1, 0],
        position=[0, 0, 2, 2, 1, 1, 3],
        lengths=np.concatenate([text_len, caps_len]),
        sample_ids=[[0, 0, r] for r in text.rows] + [[1, 0, r] for r in caps.rows],
        num_micro_batches=3, max_tokens=1024, cp=CP, pad_id=PAD_ID,
        image_token_id=IMAGE_TOKEN_ID,
    )


def _sizes(mb) -> dict[str, int]:
    return {"L": mb.seq_len, "D": mb.num_samples,
            "K": len(mb["image_token_counts"]) if "image_token_counts" in mb else 0,
            "P": int(np.prod(mb["image_shapes"], axis=1).sum()) if "image_shapes" in mb else 0}


def _check_fields(batch, expected: set[str]) -> None:
    tensors = batch_to_torch(batch)
    for mb, as_torch in zip(batch.micro_batches, tensors["micro_batches"]):
        assert set(as_torch) == expected, "the trainer's micro-batch fields differ from the table"
        sizes = _sizes(mb)
        for name, tensor in as_torch.items():
            row = FIELDS[name]
            value = mb.sample_ids if name == "sample_ids" else mb[name]
            assert value.dtype == np.dtype(row["dtype"]), name
            assert tensor.dtype == getattr(torch, row["dtype"]), name
            assert tuple(tensor.shape) == _shape(row["shape"], **sizes), (name, row["shape"])


def test_every_field_of_the_table_and_only_those(dp_batch, chunks):
    for cp_rank in (0, 1, None):
        _check_fields(dp_batch.for_rank(cp_rank), set(FIELDS))
    text, _ = chunks
    text_only = build_dp_batch(0, 0, [text], [0, 0, 0, 0], [0, 1, 2, 3],
                               np.minimum(text.num_tokens, 50), [[0, 0, r] for r in text.rows], 1,
                               max_tokens=1024)
    _check_fields(text_only.for_rank(0), set(FIELDS) - IMAGE_FIELDS)
    (mb,) = text_only.for_rank(0).micro_batches
    # cp == 1: no padding at all
    assert mb.seq_len == mb["cu_seqlens"][-1] == mb["seqlens"].sum()
    assert np.array_equal(mb["cu_seqlens"], mb["cu_seqlens_global"])


def test_each_pipeline_stage_gets_the_fields_the_stages_column_names(dp_batch):
    for tokens, labels, stages in ((True, False, {"first", "all"}), (False, True, {"last", "all"}),
                                   (False, False, {"all"})):
        batch = dp_batch.for_rank(1, receives_tokens=tokens, receives_labels=labels)
        _check_fields(batch, {name for name, row in FIELDS.items() if row["stages"] in stages})


def test_the_step_table_lists_the_keys_a_rank_gets(dp_batch):
    step = batch_to_torch(dp_batch.for_rank(0))
    assert set(step) == {row["key"] for row in _table("## The step")}
    assert step["seq_lens"] == [mb.seq_len for mb in dp_batch.for_rank(0).micro_batches]
    assert step["sample_ids"].dtype == torch.int64 and step["sample_ids"].shape == (7, 3)
    assert step["tokens_per_source"] == dp_batch.tokens_per_source


def _documents(mb, chunks):
    """Each document of a whole micro-batch: its segment, real length, and the loaded sample
    (chunk, index) its sample id names."""
    cu = mb["cu_seqlens"]
    for d, real in enumerate(mb["seqlens"].tolist()):
        source, _, row = mb.sample_ids[d]
        chunk = chunks[source]
        yield int(cu[d]), int(cu[d + 1]), real, chunk, int(np.flatnonzero(chunk.rows == row)[0])


def test_labels_are_shifted_and_the_ignore_index_lies_where_the_page_says(dp_batch, chunks):
    ignore = _ignore_index()
    assert FIELDS["labels"]["padding"] == str(ignore)
    assert FIELDS["input_ids"]["padding"] == "pad_id"
    for mb in dp_batch.for_rank(None).micro_batches:
        ids, labels, pos = mb["input_ids"], mb["labels"], mb["position_ids"]
        for s, e, real, chunk, i in _documents(mb, chunks):
            assert (e - s) % (2 * CP) == 0 and e - s - real < 2 * CP  # padded for the CP split
            patches = int(chunk.num_patches[i])
            text = chunk.token_ids[chunk.token_offsets[i]:chunk.token_offsets[i + 1]]
            doc = ids[s:s + real]
            assert (doc[:patches] == IMAGE_TOKEN_ID).all()  # placeholders before the caption
            assert np.array_equal(doc[patches:], text[:real - patches])
            expected = np.append(doc[1:], ignore)  # shifted; the last token has no target
            expected[:max(patches - 1, 0)] = ignore  # a placeholder is never a target
            assert np.array_equal(labels[s:s + real], expected)
            assert (ids[s + real:e] == PAD_ID).all() and (labels[s + real:e] == ignore).all()
            assert np.array_equal(pos[s:e], np.arange(e - s))  # restarts, counts padding on
        assert mb.seq_len == mb["cu_seqlens"][-1]  # no padding after the last document


def test_images_follow_document_order(dp_batch, chunks):
    images = 0
    for mb in dp_batch.for_rank(None).micro_batches:
        pixels, shapes, counts = [], [], []
        for _, _, _, chunk, i in _documents(mb, chunks):
            if chunk.num_patches[i]:
                pixels.append(chunk.pixels[chunk.pixel_offsets[i]:chunk.pixel_offsets[i + 1]])
                shapes.append(chunk.image_shapes[i].tolist())
                counts.append(int(chunk.num_patches[i]))
        assert mb["pixels"].tolist() == (np.concatenate(pixels).tolist() if pixels else [])
        assert mb["image_shapes"].tolist() == shapes and mb["image_token_counts"].tolist() == counts
        images += len(counts)
    assert images == 3


def test_each_cp_rank_holds_what_the_per_cp_rank_column_says(dp_batch):
    whole = dp_batch.for_rank(None)
    for cp_rank in range(CP):
        view = dp_batch.for_rank(cp_rank)
        for mb, full in zip(view.micro_batches, whole.micro_batches):
            index = zigzag_indices(full["cu_seqlens_global"], full.seq_len, CP, cp_rank)
            assert mb.seq_len == full.seq_len // CP
            for name, row in FIELDS.items():
                value = mb.sample_ids if name == "sample_ids" else mb[name]
                whole_value = full.sample_ids if name == "sample_ids" else full[name]
                rule = row["per CP rank"]
                if rule == "zigzag slice":
                    assert np.array_equal(value, whole_value[index]), name
                elif rule == "local":
                    assert np.array_equal(value, full["cu_seqlens_global"] // CP), name
                else:
                    assert rule == "whole" and np.array_equal(value, whole_value), name
            if mb.num_samples:
                assert mb.max_seqlen == int(np.diff(mb["cu_seqlens"]).max())
    empty = whole.micro_batches[2]  # a micro-batch the Planner left empty
    assert (empty.seq_len, empty["cu_seqlens"].tolist(), empty.max_seqlen) == (0, [0], 0)


def test_the_worked_example_is_what_the_constructor_builds():
    chunk = SampleChunk.from_samples("notes", 0, [0, 1], [[11, 12, 13], [21, 22, 23, 24, 25, 26]])
    dp = build_dp_batch(0, 0, [chunk], [0, 0], [0, 1], [3, 6], [[0, 0, 0], [0, 0, 1]], 1,
                        max_tokens=16, cp=2, pad_id=0)
    views = {"whole": dp.for_rank(None), "CP rank 0": dp.for_rank(0), "CP rank 1": dp.for_rank(1)}
    table = _table_with_header("| view | field | values |")
    assert {row["view"] for row in table} == set(views)
    for row in table:
        (mb,) = views[row["view"]].micro_batches
        assert mb[row["field"]].tolist() == [int(v) for v in row["values"].split()], row


def _anchor(heading: str) -> str:
    """The anchor a Markdown renderer gives a heading (GitHub's rule)."""
    text = heading.lstrip("#").strip().lower().replace("`", "")
    return re.sub(r"[^a-z0-9 _-]", "", text).replace(" ", "-")


def test_the_links_of_the_batch_and_recipe_pages_land_on_their_headings():
    docs = DOC.parent
    anchors = {page.name: {_anchor(line) for line in page.read_text().splitlines()
                           if line.startswith("#")} for page in docs.glob("*.md")}
    for name in ("batch.md", "recipes.md"):
        for target, anchor in re.findall(r"\]\(([\w.-]*\.md|)#([\w-]+)\)", (docs / name).read_text()):
            assert anchor in anchors[target or name], f"{name} links to {target or name}#{anchor}"
