"""Wait out storage outages: retry transient failures with exponential backoff up to a deadline.

An object store that restarts, fails over or throttles for a minute must not fail a training job,
and a load that fails has to be planned again elsewhere anyway. So every storage touch of a source
(the listing's glob, each footer or line count, opening a reader, reading rows) runs through
:func:`retry_storage`: a failure that :func:`~mdata.sources.faults.is_transient` calls an outage is
retried after a pause that doubles from ``retry-initial`` up to ``retry-max-interval``, with jitter
so that the many loaders of a cluster do not hammer a recovering endpoint in lock step, until
``retry-deadline`` has passed since the first failure; then :class:`StorageUnavailableError` says
where and how long mdata waited. Any other failure is raised at once. While it waits, the source
shows in :func:`~mdata.sources.waits.storage_waits`.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

from mdata.errors import StorageUnavailableError
from mdata.sources.faults import is_transient, is_unreached
from mdata.sources.waits import wait_began, wait_ended, wait_failed_again

__all__ = ["RetryPolicy", "retry_storage"]

logger = logging.getLogger("mdata.sources")

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How long, and how often, storage calls are retried while storage is unreachable.

    Args:
        deadline: seconds from the first failure after which the wait ends in
            :class:`StorageUnavailableError`; 0 gives up at the first transient failure.
        initial: the first pause, in seconds; each next one doubles, up to ``max_interval``.
        max_interval: the longest pause between two attempts.
        first_contact: how long a call given ``never_answered`` is retried while every attempt
            failed to reach the endpoint (a wrong endpoint, not an outage: see
            :mod:`mdata.sources.endpoints`); a ``deadline`` shorter than this ends the wait first.

    Each pause is drawn uniformly from ``[d/2, d]`` where ``d`` is the doubled, capped pause.
    """

    deadline: float = 300.0
    initial: float = 0.5
    max_interval: float = 30.0
    first_contact: float = 15.0

    def __post_init__(self) -> None:
        for name in ("deadline", "initial", "max_interval", "first_contact"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"RetryPolicy.{name} must be a non-negative number of seconds, got {value!r}")
        if self.initial <= 0 or self.max_interval < self.initial:
            raise ValueError(
                f"RetryPolicy needs 0 < initial <= max_interval, got initial={self.initial!r}, "
                f"max_interval={self.max_interval!r}"
            )

    @classmethod
    def from_config(cls) -> "RetryPolicy":
        """The policy under ``mdata.storage.*`` in Dask's configuration."""
        from mdata import config

        return cls(
            deadline=config.seconds("storage.retry-deadline"),
            initial=config.seconds("storage.retry-initial"),
            max_interval=config.seconds("storage.retry-max-interval"),
            first_contact=config.seconds("storage.first-contact-deadline"),
        )

    def pause(self, failures: int, rng: random.Random | None = None) -> float:
        """The pause after the ``failures``-th consecutive failure (1 for the first)."""
        ceiling = min(self.max_interval, self.initial * 2.0 ** min(failures - 1, 64))
        return ceiling * (0.5 + 0.5 * (rng or random).random())


def naming_shard(exc: StorageUnavailableError, shard: int) -> StorageUnavailableError:
    """``exc`` with ``shard`` filled in when it names none.

    A fresh or restarted loader lists its source on its first load; an outage then fails the
    listing, which knows no shard. The trainer should still learn which shard it was waiting on."""
    if exc.shard is not None:
        return exc
    named = StorageUnavailableError(exc.message, source=exc.source, shard=int(shard), hint=exc.hint)
    named.__cause__ = exc.__cause__
    return named


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 500 else text[:497] + "..."


def retry_storage(
    call: Callable[[], T],
    *,
    source: str,
    shard: str | None,
    action: str,
    policy: RetryPolicy,
    on_failure: Callable[[BaseException], None] | None = None,
    never_answered: Callable[[BaseException, float, int], BaseException] | None = None,
) -> T:
    """``call()``, retried while it fails with a transient storage error, until ``policy.deadline``.

    Args:
        call: one attempt; raises what the storage client raises.
        source: the source's name (for errors and :func:`~mdata.sources.waits.storage_waits`).
        shard: the shard's URL, or None while listing (then ``action`` names the URL).
        action: what the call does, for messages: ``"reading the Parquet footer"``.
        policy: backoff and deadline.
        on_failure: called with each transient failure (e.g. to drop a cached reader whose
            connection broke, so that the next attempt, or the next load, opens a fresh one).
        never_answered: for a first contact with an endpoint: while every attempt failed to
            reach it (:func:`~mdata.sources.faults.is_unreached`), give up after
            ``policy.first_contact`` with ``never_answered(last error, waited, attempts)``.

    Raises:
        StorageUnavailableError: the deadline passed; chained to the last failure.
        Exception: any non-transient failure of ``call``, unchanged.
    """
    token: int | None = None
    failures = 0
    began = attempt_began = 0.0
    target = shard if shard is not None else action
    reached = never_answered is None  # once an attempt reached the endpoint, it is an outage
    try:
        while True:
            attempt_began = time.monotonic()
            try:
                result = call()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                failures += 1
                error = _describe(exc)
                if on_failure is not None:
                    on_failure(exc)
                if token is None:
                    began = attempt_began  # the wait counts from the first failing attempt's start
                    since = time.time() - (time.monotonic() - began)
                    token = wait_began(source, target, error, since=since)
                    logger.warning(
                        "source %r: storage unreachable while %s%s (%s); retrying for up to %gs",
                        source, action, f" ({shard})" if shard else "", error, policy.deadline,
                    )
                else:
                    wait_failed_again(token, error)
                waited = time.monotonic() - began
                reached = reached or not is_unreached(exc)
                if waited >= policy.deadline:
                    raise StorageUnavailableError(
                        f"storage unreachable while {action}: gave up after {waited:.1f}s and "
                        f"{failures} attempt{'s' if failures != 1 else ''}; last error: {error}",
                        source=source,
                        shard=shard,
                        hint="check the storage endpoint, the network and the credentials from the "
                        "workers; to wait out longer outages raise mdata.storage.retry-deadline "
                        f"(now {policy.deadline:g}s)",
                    ) from exc
                if not reached and waited >= policy.first_contact:
                    raise never_answered(exc, waited, failures) from exc
                limit = policy.deadline if reached else min(policy.first_contact, policy.deadline)
                time.sleep(min(policy.pause(failures), limit - waited))
            else:
                if token is not None:
                    logger.warning(
                        "source %r: storage reachable again while %s%s after %.1fs and %d failed attempts",
                        source, action, f" ({shard})" if shard else "", time.monotonic() - began, failures,
                    )
                return result
    finally:
        if token is not None:
            wait_ended(token)
