"""What to do about a chunk that failed to load: the hint that ends the job's failure reason.

The hint must fit the error. Data at fault (a corrupt shard, a bad sample, a schema) is fixed in
the data or tolerated with the source's ``skip_tolerance``; storage at fault (an outage past the
retry deadline, an endpoint that never answered) is fixed at the endpoint, the network, the
credentials or ``mdata.storage.retry-deadline``: telling a user to remove a healthy shard because
the store was down sends them the wrong way.
"""

from __future__ import annotations

from mdata.errors import StorageEndpointError, StorageUnavailableError

__all__ = ["chunk_failure_hint"]

DATA_HINT = "Fix or remove the shard, or raise the source's skip_tolerance if single samples are bad"
STORAGE_HINT = ("The data is not at fault: check the source's storage endpoint, network and "
                "credentials, or raise mdata.storage.retry-deadline to wait out longer outages")
ENDPOINT_HINT = ("The data is not at fault: check the source's endpoint_url and that its storage "
                 "server runs and is reachable from the loader workers")


def chunk_failure_hint(error: BaseException) -> str:
    """The advice appended to a load failure ``error``, by what is at fault."""
    if isinstance(error, StorageEndpointError):
        return ENDPOINT_HINT
    if isinstance(error, StorageUnavailableError):
        return STORAGE_HINT
    return DATA_HINT
