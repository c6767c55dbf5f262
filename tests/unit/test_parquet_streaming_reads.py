"""ParquetShardReader streams chunk-sized batches: any row range, across row groups, reads exactly
those rows (the reader stops decoding at ``stop`` instead of materializing whole row groups)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from mdata.sources import ReaderCache, Source


def _source(tmp_path, rows: int, group: int) -> tuple[Source, list[str]]:
    texts = [f"row {i} " + "x" * (i % 13) for i in range(rows)]
    table = pa.table({"text": texts, "other": list(range(rows))})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=group)
    return Source("web", str(tmp_path / "*.parquet")), texts


def test_ranges_within_and_across_row_groups_read_exactly_their_rows(tmp_path) -> None:
    source, texts = _source(tmp_path, rows=50, group=7)
    reader = ReaderCache().reader(source, 0)
    for start, stop in [(0, 1), (0, 7), (5, 9), (7, 14), (3, 40), (13, 50), (49, 50), (0, 50), (21, 21)]:
        got = reader.read(start, stop)
        assert got["text"] == texts[start:stop], (start, stop)
        assert set(got) == {"text"}  # only the declared columns are read


def test_reads_in_any_order_after_reading_further_on(tmp_path) -> None:
    source, texts = _source(tmp_path, rows=30, group=10)
    reader = ReaderCache().reader(source, 0)
    assert reader.read(25, 30)["text"] == texts[25:30]
    assert reader.read(2, 4)["text"] == texts[2:4]  # earlier rows again: a fresh stream
    assert reader.read(9, 11)["text"] == texts[9:11]
