"""Fixtures for the source tests: real text, real images, and four real storage backends.

Text comes from Python's own standard library sources, images from the photograph matplotlib ships
(``grace_hopper.jpg``), re-encoded with Pillow at test time. Storage is a local directory (as a plain
path and as ``file://``), fsspec's in-memory filesystem, and S3 served by moto's threaded server
on 127.0.0.1 (a real HTTP server and a real s3fs client, in-process).
"""

from __future__ import annotations

import base64
import glob
import io
import json
import os
import sysconfig
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

__all__ = [
    "Store",
    "encode_image",
    "grace_hopper",
    "moto_s3",
    "store",
    "stdlib_texts",
    "write_jsonl",
    "write_parquet",
]

STORE_KINDS = ("local", "file", "memory", "s3")


def stdlib_texts(n: int, *, max_chars: int = 6000) -> list[str]:
    """``n`` real documents: the stdlib's ``*.py`` files in sorted order, cut to ``max_chars``.

    Lengths vary from a few hundred bytes to ``max_chars``, like web text; cutting keeps tests fast.
    """
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    texts = []
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(max_chars)
        if text.strip():
            texts.append(text)
        if len(texts) == n:
            return texts
    raise RuntimeError(f"the stdlib has fewer than {n} non-empty .py files")


def grace_hopper() -> Image.Image:
    """The 512x600 RGB photograph matplotlib ships (real JPEG data)."""
    import matplotlib

    path = os.path.join(matplotlib.get_data_path(), "sample_data", "grace_hopper.jpg")
    with Image.open(path) as im:
        return im.convert("RGB")


def encode_image(im: Image.Image, fmt: str = "PNG", **kwargs: Any) -> bytes:
    """Encode a Pillow image to bytes (PNG is lossless: decoded pixels equal ``im``'s exactly)."""
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


@dataclass
class Store:
    """A place to put shards: a root URL on one backend plus the storage options to reach it."""

    kind: str
    root: str  # URL prefix without a trailing slash
    storage_options: dict[str, Any] = field(default_factory=dict)

    def url(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def fs(self) -> fsspec.AbstractFileSystem:
        return fsspec.core.url_to_fs(self.root, **self.storage_options)[0]

    def write_bytes(self, rel: str, data: bytes) -> str:
        fs, path = fsspec.core.url_to_fs(self.url(rel), **self.storage_options)
        parent = path.rsplit("/", 1)[0]
        if self.kind != "s3":
            fs.makedirs(parent, exist_ok=True)
        with fs.open(path, "wb") as f:
            f.write(data)
        return self.url(rel)


def write_parquet(store: Store, rel: str, table: pa.Table | dict, *, row_group_size: int = 4) -> str:
    """Write ``table`` as Parquet (with page checksums) to ``store``; returns the file's URL."""
    if isinstance(table, dict):
        table = pa.table(table)
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=row_group_size, write_page_checksum=True)
    return store.write_bytes(rel, buf.getvalue())


def write_jsonl(store: Store, rel: str, records: list[dict], *, binary: tuple[str, ...] = ()) -> str:
    """Write ``records`` as JSON Lines; fields in ``binary`` are base64-encoded."""
    lines = []
    for rec in records:
        rec = {k: (base64.b64encode(v).decode() if k in binary and v is not None else v) for k, v in rec.items()}
        lines.append(json.dumps(rec))
    return store.write_bytes(rel, ("\n".join(lines) + "\n").encode())


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[dict[str, Any]]:
    """A moto S3 server on 127.0.0.1 (random port) and the storage options that reach it."""
    from moto.server import ThreadedMotoServer

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            options = {"client_kwargs": {"endpoint_url": f"http://{host}:{port}"}}
            yield options
        finally:
            import s3fs

            s3fs.S3FileSystem.clear_instance_cache()
            server.stop()


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest, tmp_path) -> Iterator[Store]:
    """One empty store per test, on each backend in turn (the conformance suite's parameter)."""
    kind = request.param
    if kind == "local":
        yield Store(kind, str(tmp_path))
    elif kind == "file":
        yield Store(kind, f"file://{tmp_path}")
    elif kind == "memory":
        root = f"/mdata-test-{uuid.uuid4().hex}"
        yield Store(kind, f"memory://{root}")
        fsspec.filesystem("memory").rm(root, recursive=True)
    else:
        import s3fs

        options = request.getfixturevalue("moto_s3")
        bucket = f"mdata-{uuid.uuid4().hex[:12]}"
        fs = s3fs.S3FileSystem(**options)
        fs.mkdir(bucket)
        yield Store(kind, f"s3://{bucket}/data", dict(options))
        fs.rm(bucket, recursive=True)
        s3fs.S3FileSystem.clear_instance_cache()


def image_rows(n: int) -> tuple[list[bytes], list[str]]:
    """``n`` real image-caption rows: crops of the photograph as PNG/JPEG, captions from the stdlib."""
    photo = grace_hopper()
    images, captions = [], []
    docs = stdlib_texts(n, max_chars=160)
    for i in range(n):
        box = (8 * i, 4 * i, 8 * i + 96 + 16 * i, 4 * i + 128 + 8 * i)
        crop = photo.crop(box)
        images.append(encode_image(crop, "PNG" if i % 2 == 0 else "JPEG"))
        captions.append(docs[i].splitlines()[0] or f"crop {i}")
    return images, captions


def as_array(im_bytes: bytes) -> np.ndarray:
    """Pixels of encoded image bytes, as Pillow decodes them (RGB)."""
    with Image.open(io.BytesIO(im_bytes)) as im:
        return np.asarray(im.convert("RGB"))
