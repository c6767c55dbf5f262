"""An S3 server that can go away and come back: a real moto server on one fixed port of 127.0.0.1.

Outage tests stop it in the middle of a source's reads and start it again on the same port
(moto's in-process backend keeps the buckets; :func:`restore` puts back anything it lost).
:func:`outage_options` are the s3fs storage options those tests read with: botocore's own retries
off (``max_attempts: 0``) so that each failed attempt is quick and mdata's retry loop is what the
test sees, and no read-ahead cache, so each row group read after the outage really goes to the
server (a 50 MB block would have fetched small shards whole).
"""

from __future__ import annotations

from typing import Any

from fixtures_faults import closed_port

__all__ = ["AWS_TEST_ENV", "S3Server", "outage_options", "restore"]

#: Test credentials, so botocore never looks further (instance metadata) for real ones.
AWS_TEST_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1"}


def outage_options(port: int) -> dict[str, Any]:
    """s3fs storage options for the server on ``port`` (see the module docstring)."""
    return {
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"},
        "config_kwargs": {"retries": {"max_attempts": 0}},
        "default_cache_type": "none",
    }


class S3Server:
    """A moto S3 server on one fixed port of 127.0.0.1 that can be stopped and started again."""

    def __init__(self) -> None:
        self.port = closed_port()
        self._server = None

    @property
    def options(self) -> dict[str, Any]:
        return outage_options(self.port)

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    @property
    def running(self) -> bool:
        return self._server is not None


def restore(port: int, bucket: str, objects: dict[str, bytes]) -> None:
    """Put back any object a restarted server lost (moto's in-process backend usually keeps them)."""
    import s3fs

    fs = s3fs.S3FileSystem(**outage_options(port), skip_instance_cache=True)
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    for path, data in objects.items():
        if not fs.exists(path) or fs.cat_file(path) != data:
            fs.pipe_file(path, data)
