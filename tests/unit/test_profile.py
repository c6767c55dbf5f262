"""Source profiles (mdata.pools.profile): the math, the file, and a real measurement on real rows."""

from __future__ import annotations

import io
import json

import pytest

from fixtures_sources import Store, encode_image, grace_hopper, stdlib_texts, write_parquet
from mdata.errors import PlanError
from mdata.pools.profile import PROFILE_VERSION, Profile, SourceProfile, parallel_fraction
from mdata.pools.profile_progress import Progress
from mdata.pools.profiling import _ranges, profile_sources


def test_parallel_fraction_inverts_amdahl():
    for p in (0.0, 0.3, 0.9, 1.0):
        speedup = 1.0 / ((1 - p) + p / 4)
        assert parallel_fraction(speedup, 4) == pytest.approx(p)
    assert parallel_fraction(0.8, 2) == 0.0 and parallel_fraction(2.5, 2) == 1.0  # noise is clamped
    assert parallel_fraction(3.0, 1) == 0.0


def test_ranges_are_chunks_round_robin_over_shards():
    assert _ranges([(0, 100), (1, 5)], chunk_rows=8, rows=20) == [(0, 0, 8), (1, 0, 5), (0, 8, 15)]
    assert _ranges([(0, 3)], chunk_rows=8, rows=50) == [(0, 0, 3)]  # fewer rows than asked


def test_profile_file_round_trip_and_versions(tmp_path):
    one = SourceProfile("a", 64, 0.002, 0.0019, 100.0, 5000, 16, 2, 500.0, 900.0, True)
    profile = Profile((one,), {"cpus": 2})
    path = profile.save(tmp_path / "p.json")
    again = Profile.load(path)
    assert again == profile and again["a"].task_seconds == pytest.approx(0.032)
    assert again["a"].speedup == pytest.approx(1.8)
    data = json.loads(path.read_text())
    data["mdata_profile"] = PROFILE_VERSION + 1
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match="newer than this mdata reads"):
        Profile.load(path)
    with pytest.raises(PlanError, match="twice"):
        Profile((one, one))


def test_profiling_measures_real_sources_through_load_chunk(tmp_path):
    """Text and image sources profiled on the loader's code path: images cost more per sample and
    weigh more in memory; the table and the bar say what was measured."""
    from mdata.sources import DecodeImageCaption, Source, TokenizeText

    store = Store("local", str(tmp_path))
    texts = stdlib_texts(24, max_chars=800)
    write_parquet(store, "text/part-0.parquet", {"text": texts})
    photo = encode_image(grace_hopper(), "JPEG", quality=90)
    write_parquet(store, "img/part-0.parquet", {"image": [photo] * 12, "caption": texts[:12]})
    sources = [Source("notes", store.url("text"), chunk_rows=8, transform=TokenizeText()),
               Source("photos", store.url("img"), chunk_rows=4, transform=DecodeImageCaption())]
    err = io.StringIO()
    import contextlib

    with contextlib.redirect_stderr(err):
        profile = profile_sources(sources, rows=12, threads=2, progress=False)
    notes, photos = profile["notes"], profile["photos"]
    assert notes.samples == 12 and photos.samples == 12 and photos.produces_images
    assert photos.cpu_seconds_per_sample > notes.cpu_seconds_per_sample > 0
    assert photos.bytes_per_sample > 256 * 16 * 16 * 3 * 0.5 > notes.bytes_per_sample  # pixels vs tokens
    assert notes.reader_bytes > 0 and notes.samples_per_s_n > 0 and notes.threads == 2
    assert "profiled notes: 12 samples" in err.getvalue() and "profiled photos" in err.getvalue()
    table = profile.table()
    assert table.splitlines()[0].split()[:3] == ["source", "samples", "ms/sample"]
    assert any(line.startswith("photos ") for line in table.splitlines())
    with pytest.raises(PlanError, match="names only"):
        profile_sources(["notes"])


def test_progress_bar_draws_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    bar = Progress(2, stream=out)
    bar.start("chat")
    bar.phase("one thread")
    assert "[" + "." * 24 + "] 0/2 chat: one thread" in out.getvalue()
    bar.done(SourceProfile("chat", 8, 1e-4, 1e-4, 10.0, 1, 8, 1, 1e4, 1e4))
    bar.start("code")
    assert "[" + "#" * 12 + "." * 12 + "] 1/2 code" in out.getvalue()
