"""Source specs: validated at construction, frozen, picklable, comparable."""

from __future__ import annotations

import pickle

import pytest

from mdata.errors import InvalidSourceError, TransformConfigError, UnknownFormatError
from mdata.sources import DecodeImageCaption, Format, SampleTransform, Source, TokenizeText


def test_defaults_read_exactly_the_transform_fields():
    s = Source("web", "/data/*.parquet")
    assert s.format is Format.PARQUET
    assert s.fields == ("text",)
    assert s.transform == TokenizeText()
    assert (s.chunk_rows, s.skip_tolerance, s.max_tokens) == (256, 0.0, None)
    assert s.pool_resource == "pool_web"

    img = Source("photos", "/img", format="parquet", transform=DecodeImageCaption(caption_field="alt"))
    assert img.fields == ("image", "alt")


def test_format_string_is_normalised_to_the_enum():
    assert Source("chat", "/c/*.jsonl", format="jsonl").format is Format.JSONL


def test_unknown_format_raises_at_construction():
    with pytest.raises(UnknownFormatError, match=r"source 'web': unknown format 'csv' \(supported formats: parquet, jsonl, video\)"):
        Source("web", "/data/*.csv", format="csv")


@pytest.mark.parametrize("name", ["Web", "1web", "web-text", "", "web text"])
def test_name_must_be_a_lowercase_identifier(name):
    with pytest.raises(InvalidSourceError, match=r"invalid source name.*lowercase identifier"):
        Source(name, "/data/*.parquet")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chunk_rows": 0}, r"chunk_rows must be a positive int, got 0"),
        ({"skip_tolerance": 1.0}, r"skip_tolerance must be a fraction in \[0, 1\), got 1\.0"),
        ({"skip_tolerance": -0.1}, r"skip_tolerance must be a fraction in \[0, 1\), got -0\.1"),
        ({"max_tokens": 0}, r"max_tokens must be a positive int or None, got 0"),
        ({"fields": ("id",)}, r"fields \('id',\) omit \['text'\], which the transform reads"),
        ({"fields": ("text", "text")}, r"fields must be distinct"),
        ({"url": ""}, r"url must be a non-empty string"),
        ({"transform": len}, r"transform <built-in function len> is not a sample transform"),
        ({"storage_options": [("anon", True)]}, r"storage_options must be a mapping, got list"),
    ],
)
def test_invalid_arguments_name_the_source(kwargs, message):
    args = {"url": "/data/*.parquet", **kwargs}
    with pytest.raises(InvalidSourceError, match=r"source 'web': " + message):
        Source("web", **args)


def test_extra_fields_are_kept_in_order():
    s = Source("web", "/d", fields=("id", "text"))
    assert s.fields == ("id", "text")


def test_pickle_round_trip_equal_and_hashable():
    s = Source(
        "web", "s3://bucket/web/*.parquet",
        storage_options={"client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}},
        transform=TokenizeText(max_tokens=512), skip_tolerance=0.01,
    )
    back = pickle.loads(pickle.dumps(s))
    assert back == s and hash(back) == hash(s)
    assert back.cache_key == s.cache_key
    # Another endpoint is another set of files: never the same reader-cache entry.
    other = Source("web", s.url, storage_options={"client_kwargs": {"endpoint_url": "http://x"}})
    assert other.cache_key != s.cache_key


def test_small_pickles_no_tokenizer_state():
    # The tokenizer is loaded lazily per process: shipping a Source to a task ships a few strings.
    s = Source("web", "/d/*.parquet")
    s.transform.setup()
    assert len(pickle.dumps(s)) < 1000


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: TokenizeText(field=""), r"TokenizeText: field must be a non-empty column name"),
        (lambda: TokenizeText(tokenizer=""), r"TokenizeText: tokenizer must be"),
        (lambda: TokenizeText(max_tokens=0), r"TokenizeText: max_tokens must be a positive int or None, got 0"),
        (lambda: TokenizeText(num_threads=0), r"TokenizeText: num_threads must be an int >= 1"),
        (lambda: DecodeImageCaption(patch_size=0), r"DecodeImageCaption: patch_size must be a positive int, got 0"),
        (lambda: DecodeImageCaption(max_patches=-1), r"DecodeImageCaption: max_patches must be"),
        (lambda: DecodeImageCaption(image_field="x", caption_field="x"), r"image_field and caption_field are both 'x'"),
    ],
)
def test_transform_arguments_are_checked(factory, message):
    with pytest.raises(TransformConfigError, match=message):
        factory()


def test_custom_transform_is_accepted():
    class Upper(SampleTransform):
        def required_fields(self):
            return {}

    assert Source("web", "/d", transform=Upper(), fields=("text",)).fields == ("text",)
