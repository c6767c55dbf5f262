"""The ranks of one client tell their consumption over its batched stream, and wait for the
scheduler's confirmation.

With pushed locations the ranks seldom send the location requests that would carry their
consumption, so it travelled as one ``mdata_consumed`` RPC per client and step. The
:class:`~mdata.trainer.location_hub.LocationHub` sends those tells as one
:class:`~mdata.wire.stream_tells.StreamedTells` over ``client._send_to_scheduler`` instead,
numbered, and the teller thread that sent them waits here for the
:class:`~mdata.wire.stream_tells.TellsConfirmed` with that number, which the client's stream
handler (:func:`confirm_handler`, on the client's event loop) files. Each tell's error comes
back in it, typed, as from the RPC.

Never lost: a message not confirmed within the usual reply timeout (``mdata.requests.timeout``)
is sent again, once, with the same number; one sent on a stream that was replaced since (the
client reconnected: ``client.scheduler_comm`` changed) is sent again on the new one. A second
timeout raises :class:`~mdata.errors.RequestTimeoutError`, as the RPC would have (the teller keeps
the steps and tells them again later). The scheduler counts a repeated step once.

The stream is used only once the scheduler said it takes tells there (``HostLocationReply.tells``,
with the push subscription); until then, and with ``mdata.trainer.stream-tells`` off (the default,
until it measures faster), tells go as the RPC.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Any

from mdata.errors import MdataError, RequestTimeoutError
from mdata.trainer.pushed_locations import current_stream, hub_stream_handler
from mdata.wire.host_location import ConsumedTell
from mdata.wire.stream_tells import TELL_OP, StreamedTells, TellsConfirmed

__all__ = ["TellStream", "confirm_handler"]

logger = logging.getLogger("mdata.trainer")

#: How often a teller waiting for its confirmation checks that its stream is still the client's.
CHECK_S = 0.1

#: Sequence numbers, unique in the process: a late confirmation never matches a later hub's tell.
_SEQ = itertools.count(1)


class TellStream:
    """One hub's numbered tells over its client's stream, and their confirmations."""

    def __init__(self, client: Any, job: str, timeout_s: float) -> None:
        self.client, self.job, self.timeout_s = client, job, float(timeout_s)
        self.accepted = False  # the scheduler said it takes tells over the stream
        self.sent = 0  # messages sent (resends included), resent, confirmed
        self.resent = 0
        self.confirmed = 0
        self.drop = 0  # a test hook: the next ``drop`` confirmations are dropped, as if lost
        self._lock = threading.Lock()
        self._waiting: dict[int, list] = {}  # seq -> [event, confirmation or None]

    def usable(self) -> bool:
        """Whether to tell over the stream now (else: the RPC)."""
        return self.accepted and current_stream(self.client) is not None

    def tell(self, tells: tuple[ConsumedTell, ...]) -> tuple[MdataError | None, ...]:
        """Send ``tells``, wait for their confirmation (resending as the module docstring says),
        and return each tell's error or None."""
        seq = next(_SEQ)
        message = {"op": TELL_OP, "tells": StreamedTells(self.job, seq, tells).to_msg()}
        slot: list = [threading.Event(), None]
        with self._lock:
            self._waiting[seq] = slot
        try:
            timeouts = 0
            while True:
                stream = current_stream(self.client)
                self.client._send_to_scheduler(dict(message))
                self.sent += 1
                deadline = time.monotonic() + self.timeout_s
                while not slot[0].wait(CHECK_S):
                    if current_stream(self.client) is not stream or time.monotonic() > deadline:
                        break
                if slot[0].is_set():
                    return slot[1].per_tell(len(tells))
                if current_stream(self.client) is stream:  # not a reconnect: a timeout
                    timeouts += 1
                    if timeouts > 1:
                        raise RequestTimeoutError(
                            f"no confirmation of consumption tell {seq} of job {self.job!r} from "
                            f"the scheduler within {self.timeout_s:g}s, sent twice: it is gone, "
                            "unreachable or stuck (raise mdata.requests.timeout if only slow)")
                self.resent += 1
                logger.info("mdata job %s: consumption tell %d not confirmed%s; sending it again",
                            self.job, seq, "" if timeouts else " (the client reconnected)")
        finally:
            with self._lock:
                self._waiting.pop(seq, None)

    def receive(self, confirmed: TellsConfirmed) -> None:
        """File a confirmation (on the client's event loop) for the teller waiting on it."""
        with self._lock:
            if self.drop > 0:
                self.drop -= 1
                return
            slot = self._waiting.get(confirmed.seq)
            if slot is None or slot[0].is_set():
                return  # a repeat's confirmation, or the teller gave up
            slot[1] = confirmed
            self.confirmed += 1
            slot[0].set()


def confirm_handler(client: Any, hubs: dict, lock: threading.Lock):
    """The client's stream handler for :data:`~mdata.wire.stream_tells.CONFIRM_OP`: each
    confirmation goes to the hub of its job on this client (``hubs``: (id(client), job) -> hub)."""
    # a malformed one is dropped: its teller times out and resends
    return hub_stream_handler(client, hubs, lock, key="confirmed", parse=TellsConfirmed.from_msg,
                              part="streamed", what="consumption confirmation")
