"""Constructor-to-trainer transport: Batch objects over ``distributed.comm`` against raw TCP.

A receiver process (this file run with ``--serve``) listens on loopback with a real
``distributed.comm`` listener and a plain TCP socket. The benchmark process streams batches of
about 16, 32 and 48 MB (8 packed micro-batches of 16k tokens plus one image each, built by
:func:`mdata.batch.build_dp_batch`, CP rank 0 of cp=2) to it in three ways, interleaved within
each repetition so that machine noise hits all three alike:

* ``batch``: ``comm.write({"batch": to_serialize(batch)})`` with mdata's wire format; the receiver
  deserializes each message into a :class:`~mdata.batch.Batch` (what a trainer does).
* ``frames``: the same array bytes as plain numpy frames through the same comm (distributed's own
  numpy serializer, no Batch header): the cost of distributed itself.
* ``raw``: the same bytes over a plain socket (``sendall`` / ``recv_into`` a fresh buffer per
  message, as distributed does): the ceiling on this machine.

Each measurement streams N messages and ends with a round trip (the receiver acknowledges after
reading the last one), so the time covers delivery, not just queuing. Figures: ``comms.stream_gbps``
(median GB/s of Batch streaming over sizes and repetitions) beside raw TCP, ``comms.vs_raw_tcp``
(median of the per-repetition ratios), per-size medians and the comm-frames ratio.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SIZES_MB = (16, 32, 48)
_HEADER = struct.Struct("!Q")


# -- the batches ---------------------------------------------------------------------------------


def make_batch(target_mb: int, *, micro_batches: int = 8, context: int = 16384, seed: int = 0):
    """A CP-rank slice of a realistic DP batch of about ``target_mb`` MB: packed text plus images."""
    from mdata.batch import build_dp_batch
    from mdata.sources.chunk import SampleChunk

    rng = np.random.default_rng(seed)
    patches = 256
    # text: int32 input_ids/labels/position_ids for `context` tokens per micro-batch (cp=2 halves)
    text_bytes = micro_batches * (context // 2) * 12
    side = int(np.sqrt(max(target_mb * 1e6 - text_bytes, 0) / micro_batches / 3))
    text, images = [], []
    for m in range(micro_batches):
        text.append(rng.integers(1, 100_000, size=context - patches - 1 - 1024, dtype=np.int32))
        text.append(rng.integers(1, 100_000, size=1024, dtype=np.int32))
    for m in range(micro_batches):
        images.append(rng.integers(0, 256, size=(side, side, 3), dtype=np.uint8))
    docs = SampleChunk.from_samples("web", 0, np.arange(2 * micro_batches), text)
    caps = SampleChunk.from_samples(
        "caps", 0, np.arange(micro_batches), [[1]] * micro_batches,
        num_patches=[patches] * micro_batches, images=images,
    )
    n_text, n = 2 * micro_batches, 3 * micro_batches
    mb = np.concatenate([np.repeat(np.arange(micro_batches), 2), np.arange(micro_batches)])
    pos = np.concatenate([np.tile([1, 2], micro_batches), np.zeros(micro_batches, np.int64)])
    lengths = np.concatenate([[len(t) for t in text], np.full(micro_batches, patches + 1)])
    ids = np.zeros((n, 3), dtype=np.int64)
    ids[:n_text, 2] = np.arange(n_text)
    ids[n_text:] = np.stack([np.ones(micro_batches), np.zeros(micro_batches),
                             np.arange(micro_batches)], 1)
    dp = build_dp_batch(0, 0, [docs, caps], mb, pos, lengths, ids, micro_batches,
                        max_tokens=context, cp=2, image_token_id=100_001)
    return dp.for_rank(0)


# -- the receiver process ------------------------------------------------------------------------


def _raw_server(sock: socket.socket) -> None:
    """Accept one connection; read length-prefixed messages; a zero length asks for an ack."""
    conn, _ = sock.accept()
    with conn:
        head = bytearray(_HEADER.size)
        while True:
            if not _recv_into(conn, memoryview(head)):
                return
            (n,) = _HEADER.unpack(head)
            if n == 0:
                conn.sendall(b"A")
                continue
            buf = np.empty(n, dtype=np.uint8)  # a fresh buffer per message, like distributed
            if not _recv_into(conn, memoryview(buf)):
                return


def _recv_into(conn: socket.socket, view: memoryview) -> bool:
    got = 0
    while got < view.nbytes:
        k = conn.recv_into(view[got:])
        if k == 0:
            return False
        got += k
    return True


async def _serve() -> None:
    from distributed.comm import listen

    import mdata.wire.frames  # noqa: F401  the receiver must know the wire format
    from mdata.batch import Batch

    done = asyncio.Event()

    async def handle(comm):
        received = 0
        while True:
            msg = await comm.read()
            if msg == "done":
                await comm.write({"ack": received})
                received = 0
            elif msg == "close":
                await comm.close()
                done.set()
                return
            else:
                batch = msg.get("batch")
                if batch is not None and not isinstance(batch, Batch):
                    raise TypeError(f"expected a Batch, got {type(batch).__name__}")
                received += 1

    listener = listen("tcp://127.0.0.1:0", handle, deserialize=True)
    await listener.start()
    raw = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_raw_server, args=(raw,), daemon=True).start()
    print(json.dumps({"comm": listener.contact_address, "raw": raw.getsockname()[1]}), flush=True)
    await done.wait()
    listener.stop()
    raw.close()


# -- the sender ----------------------------------------------------------------------------------


async def _stream_comm(comm, messages: list, count: int) -> float:
    began = time.perf_counter()
    for i in range(count):
        await comm.write(messages[i % len(messages)])
    await comm.write("done")
    reply = await comm.read()
    elapsed = time.perf_counter() - began
    if reply != {"ack": count}:
        raise RuntimeError(f"receiver acknowledged {reply!r}, expected {count} messages")
    return elapsed


def _stream_raw(sock: socket.socket, frames: list, count: int) -> float:
    total = sum(f.nbytes for f in frames)
    began = time.perf_counter()
    for _ in range(count):
        sock.sendall(_HEADER.pack(total))
        for f in frames:
            sock.sendall(f)
    sock.sendall(_HEADER.pack(0))
    if sock.recv(1) != b"A":
        raise RuntimeError("raw receiver did not acknowledge")
    return time.perf_counter() - began


async def _measure(addresses: dict, batches: dict, count: int, repeats: int) -> dict:
    from distributed.comm import connect
    from distributed.protocol import to_serialize

    import mdata.wire.frames as wire

    comm = await connect(addresses["comm"])
    raw = socket.create_connection(("127.0.0.1", addresses["raw"]))
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    results: dict[str, dict[int, list[float]]] = {"batch": {}, "frames": {}, "raw": {}}
    try:
        for size, batch in batches.items():  # warm up: connections, allocator, first serializer
            frames = wire.dumps_batch(batch)[1]
            await _stream_comm(comm, [{"batch": to_serialize(batch)}], 1)
            _stream_raw(raw, frames, 1)
        for _ in range(repeats):
            for size, batch in batches.items():
                nbytes = batch.nbytes * count / 1e9
                frames = wire.dumps_batch(batch)[1]
                arrays = [np.frombuffer(f, dtype=np.uint8) for f in frames]
                as_batch = [{"batch": to_serialize(batch)}]
                as_frames = [{"frames": [to_serialize(a) for a in arrays]}]
                results["batch"].setdefault(size, []).append(
                    nbytes / await _stream_comm(comm, as_batch, count))
                results["frames"].setdefault(size, []).append(
                    nbytes / await _stream_comm(comm, as_frames, count))
                results["raw"].setdefault(size, []).append(nbytes / _stream_raw(raw, frames, count))
        await comm.write("close")
    finally:
        raw.close()
        await comm.close()
    return results


def run(quick: bool) -> dict[str, object]:
    from benchmarks.harness import figure

    count = 4 if quick else 10
    repeats = 3 if quick else 7
    batches = {mb: make_batch(mb) for mb in SIZES_MB}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--serve"],
        stdout=subprocess.PIPE, env=env, text=True,
    )
    try:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the receiver process exited before listening")
        results = asyncio.run(_measure(json.loads(line), batches, count, repeats))
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    def median(values):
        return float(statistics.median(values))

    all_batch = [v for vs in results["batch"].values() for v in vs]
    all_raw = [v for vs in results["raw"].values() for v in vs]
    ratios = [b / r for size in SIZES_MB for b, r in zip(results["batch"][size], results["raw"][size])]
    frame_ratios = [
        b / f for size in SIZES_MB for b, f in zip(results["batch"][size], results["frames"][size])
    ]
    note = (f"loopback, 2 processes, {count} batches per measurement, median of {repeats} reps x "
            f"{len(SIZES_MB)} sizes ({'/'.join(map(str, SIZES_MB))} MB)")
    figures: dict[str, object] = {
        "comms.stream_gbps": figure(median(all_batch), median(all_raw), unit="GB/s",
                                    goal="~2-3 GB/s on loopback",
                                    note=f"Batch over distributed.comm vs raw TCP; {note}"),
        "comms.vs_raw_tcp": figure(median(ratios), goal=">= 0.5 (distributed comm overhead)",
                                   note="median of paired (same size, same rep) ratios"),
        "comms.vs_comm_frames": figure(median(frame_ratios), goal="~1",
                                       note="Batch format vs the same bytes as numpy frames"),
    }
    for size in SIZES_MB:
        figures[f"comms.stream_gbps_{size}mb"] = figure(
            median(results["batch"][size]), median(results["raw"][size]), unit="GB/s",
            note=f"batch of {batches[size].nbytes / 1e6:.1f} MB",
        )
    return figures


if __name__ == "__main__":
    if "--serve" in sys.argv:
        asyncio.run(_serve())
    else:
        from benchmarks.harness import render_table

        print(render_table(run(quick="--quick" in sys.argv)))
