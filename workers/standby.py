"""Standby loaders: what runs inside a pool worker to keep it warm and to change its role.

A standby (``standby_<source>=N``, see :mod:`mdata.pools.standbys`) takes no load task. Instead the
Planner sends it a warm task per registered job that lists each source of its pool, opens its
shards' readers (Parquet footers) in the process-wide :func:`~mdata.sources.default_reader_cache`
and pushes one row through the source's transform (loading the tokenizer or image decoder), so
that a promoted standby's first load task costs what a warm loader's does. The role handler
(``mdata_set_role``) swaps the worker's resources when the Planner promotes or demotes it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from mdata.errors import MdataError
from mdata.sources.spec import Source
from mdata.spec import SourceSpec
from mdata.wire.messages import SetRoleReply, SetRoleRequest
from workers.loader import build_source

logger = logging.getLogger("mdata.standby")


def warm_sources_task(sources: list[Source | SourceSpec]) -> dict[str, dict[str, Any]]:
    """Dask task body (pinned to one standby): open ``sources`` in this process.

    Opens at most the reader cache's capacity, shared among the sources (more would only evict
    readers opened a moment ago). A source that fails here is reported in the result and left to
    the real load task, which raises its typed error where the job can see it."""
    from mdata.sources.cache import default_reader_cache
    from mdata.sources.load import load_chunk

    cache = default_reader_cache()
    share = max(1, cache.max_readers // max(1, len(sources)))
    out: dict[str, dict[str, Any]] = {}
    for spec in sources:
        began = time.perf_counter()
        try:
            source = build_source(spec)  # the scheduler sends specs: the transform is imported here
            shards = cache.listing(source).shards
            for info in shards[:share]:
                cache.reader(source, info.index)
            first = next((info for info in shards if info.num_rows > 0), None)
            if first is not None:  # one row through the transform: tokenizer, decoder, imports
                load_chunk(source, first.index, 0, 1, cache=cache)
            out[spec.name] = {"shards": len(shards), "readers": min(share, len(shards)),
                                "seconds": time.perf_counter() - began}
        except MdataError as exc:
            logger.warning("warming source %r on a standby failed: %s", spec.name, exc)
            out[spec.name] = {"error": str(exc), "seconds": time.perf_counter() - began}
    return out


def make_set_role_handler(worker):
    """Build the function behind ``mdata_set_role``: hold ``resources``, give up ``drop``.

    This changes the worker's own accounting only (as ``Worker.set_resources`` does, resources in
    use by a running task stay accounted); the Planner updates the scheduler's side itself, in
    the order that keeps tasks from reaching a worker that cannot run them. A dropped resource
    nothing uses any more is forgotten, so the worker re-registers without it."""

    def set_role(req: SetRoleRequest) -> SetRoleReply:
        state = worker.state
        changes = {**{r: 0.0 for r in req.drop}, **req.resources}
        for resource, amount in changes.items():
            if resource in state.total_resources:
                state.available_resources[resource] += amount - state.total_resources[resource]
            else:
                state.available_resources[resource] = amount
            state.total_resources[resource] = amount
        for resource in req.drop:
            if resource not in req.resources and state.total_resources.get(resource) == 0 \
                    and state.available_resources.get(resource) == 0:
                del state.total_resources[resource]
                del state.available_resources[resource]
        worker.mdata_role = req.role
        logger.info("mdata: this worker is now a %s (%s)", req.role, dict(state.total_resources))
        return SetRoleReply(dict(state.total_resources))

    return set_role
