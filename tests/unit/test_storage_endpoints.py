"""A storage endpoint that has never answered is a configuration error; one that answered once and
went away is an outage, waited out.

Real parts: a real s3fs client against an unused port of 127.0.0.1 (nothing listens: what a wrong
``endpoint_url`` looks like), and the real moto S3 server of the outage tests, stopped and started
again. The endpoint test runs under mdata's default configuration and botocore's default retries,
as a user's source would, and measures the time to the error.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from fixtures_faults import closed_port, refused
from fixtures_s3 import S3Server, outage_options
from fixtures_sources import Store, stdlib_texts, write_parquet
from mdata.errors import StorageEndpointError, StorageUnavailableError
from mdata.sources import RetryPolicy, Source, list_shards, storage_waits
from mdata.sources.faults import is_unreached


@pytest.fixture
def aws_env(monkeypatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


@pytest.mark.slow  # the trainer's view of it: tests/cluster/test_registration.py::test_a_wrong_endpoint_url_fails_the_registering_trainer_within_30s
def test_a_wrong_endpoint_url_fails_listing_within_30s_naming_source_and_endpoint(aws_env):
    endpoint = f"http://127.0.0.1:{closed_port()}"
    url = f"s3://bucket-{uuid.uuid4().hex[:8]}/web/*.parquet"
    # what a user writes: only the endpoint; botocore's own retries and mdata's defaults
    source = Source("web", url, storage_options={"client_kwargs": {"endpoint_url": endpoint}})
    outcome: list[BaseException] = []

    def listing() -> None:
        try:
            list_shards(source)  # RetryPolicy.from_config(): retry-deadline 300s
        except BaseException as exc:  # noqa: BLE001 - judged below
            outcome.append(exc)

    began = time.monotonic()
    thread = threading.Thread(target=listing, daemon=True)
    thread.start()
    thread.join(45)
    elapsed = time.monotonic() - began
    assert not thread.is_alive(), f"no error within {elapsed:.0f}s (retry-deadline is 300s)"
    print(f"\nwrong endpoint_url: StorageEndpointError after {elapsed:.1f}s")
    err = outcome[0]
    assert isinstance(err, StorageEndpointError), repr(err)
    assert elapsed < 30
    assert err.source == "web" and err.endpoint == endpoint
    assert str(err).startswith(f"source 'web': storage endpoint {endpoint} has never answered "
                               f"while listing '{url}'")
    assert "EndpointConnectionError" in str(err) and "check endpoint_url" in str(err)
    assert storage_waits() == {}


def test_an_endpoint_that_answered_before_is_waited_out_past_the_first_contact_deadline(aws_env):
    import s3fs

    server = S3Server()
    server.start()
    try:
        bucket = f"back-{uuid.uuid4().hex[:8]}"
        fs = s3fs.S3FileSystem(**outage_options(server.port), skip_instance_cache=True)
        fs.mkdir(bucket)
        store = Store("s3", f"s3://{bucket}/web", outage_options(server.port))
        write_parquet(store, "a.parquet", {"text": stdlib_texts(8)}, row_group_size=4)
        source = Source("web", f"s3://{bucket}/web/*.parquet", storage_options=outage_options(server.port))
        policy = RetryPolicy(deadline=30, initial=0.05, max_interval=0.2, first_contact=0.3)
        assert [s.num_rows for s in list_shards(source, retry=policy).shards] == [8]  # answered

        server.stop()
        s3fs.S3FileSystem.clear_instance_cache()  # no cached directory listing: the glob asks the server
        restart = threading.Timer(1.5, server.start)  # the outage lasts 5x the first-contact deadline
        began = time.monotonic()
        restart.start()
        listing = list_shards(source, retry=policy)
        waited = time.monotonic() - began
        restart.join()
    finally:
        server.stop()
        s3fs.S3FileSystem.clear_instance_cache()
    assert [s.num_rows for s in listing.shards] == [8]
    assert waited >= 1.5  # ridden through: the listing waited for the server to come back


def test_an_outage_on_a_known_endpoint_still_ends_in_storage_unavailable(aws_env):
    import s3fs

    server = S3Server()
    server.start()
    try:
        bucket = f"gone-{uuid.uuid4().hex[:8]}"
        store = Store("s3", f"s3://{bucket}/web", outage_options(server.port))
        s3fs.S3FileSystem(**outage_options(server.port), skip_instance_cache=True).mkdir(bucket)
        write_parquet(store, "a.parquet", {"text": stdlib_texts(4)}, row_group_size=4)
        source = Source("web", f"s3://{bucket}/web/*.parquet", storage_options=outage_options(server.port))
        policy = RetryPolicy(deadline=0.8, initial=0.05, max_interval=0.2, first_contact=0.2)
        list_shards(source, retry=policy)
    finally:
        server.stop()
        s3fs.S3FileSystem.clear_instance_cache()  # no cached directory listing: the glob asks the server
    with pytest.raises(StorageUnavailableError) as info:
        list_shards(source, retry=policy)
    assert not isinstance(info.value, StorageEndpointError)
    assert f"source 'web': storage unreachable while listing '{source.url}': gave up after" in str(info.value)


def test_refused_and_unresolved_connections_are_unreached_and_dropped_ones_are_not():
    import socket

    assert is_unreached(refused())
    try:
        socket.getaddrinfo("no-such-host.invalid", 80)
    except socket.gaierror as exc:
        assert is_unreached(exc)
    wrapped = OSError("listing failed")
    wrapped.__cause__ = refused()
    assert is_unreached(wrapped)
    assert not is_unreached(ConnectionResetError(104, "Connection reset by peer"))
    assert not is_unreached(TimeoutError("read timed out"))
