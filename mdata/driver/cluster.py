"""Start an mdata cluster on one machine, or connect to one that runs elsewhere.

An mdata cluster is a plain Dask cluster whose scheduler runs the Planner (preloaded as
``scheduler_plugins.planner``) and whose workers carry *pool resources*: a worker with
``pool_<source>=N`` loads that source, one with ``mdata_constructor=N`` builds batches. The
embedded cluster below is a ``SpecCluster`` with one worker template per pool, so each pool can be
scaled on its own (Dask's ``Adaptive`` is pool-blind). A pool may also keep warm *standbys*
(``standby_<source>=N``, :mod:`mdata.pools.standbys`) that take over a lost loader's chunks. Beyond one
machine the same roles come from the dask CLI (``dask scheduler --preload scheduler_plugins.planner``;
``dask worker ADDR --resources pool_text=1``, a standby with ``--resources standby_text=1``),
Kubernetes worker groups or Slurm jobs; trainers attach by address.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mdata.driver.autoscale import PoolAutoscaler  # noqa: F401 - it lived here; still importable
from mdata.errors import PlanError, RequestTimeoutError

if TYPE_CHECKING:
    from mdata.pools.layout import LayoutPool, PoolLayout

__all__ = ["PoolSpec", "MdataCluster", "start_cluster", "default_pools", "layout_pools"]

PLANNER_PRELOAD = "scheduler_plugins.planner"
CONSTRUCTOR_RESOURCE = "mdata_constructor"
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class PoolSpec:
    """One loader pool: the sources it serves, how many workers, threads per worker, and how many
    warm standbys take over a lost loader's chunks (None: ``mdata.cluster.standbys``)."""

    name: str
    sources: tuple[str, ...]
    workers: int = 1
    threads: int = 1
    memory_limit: str | int = "4GiB"
    standbys: int | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise PlanError(f"pool name {self.name!r} must be a lowercase identifier")
        if not self.sources:
            raise PlanError(f"pool {self.name!r} serves no source")
        if self.workers < 0 or self.threads < 1:
            raise PlanError(f"pool {self.name!r}: workers must be >= 0 and threads >= 1")
        if self.standbys is not None and (not isinstance(self.standbys, int) or self.standbys < 0):
            raise PlanError(f"pool {self.name!r}: standbys must be an int >= 0, got {self.standbys!r}")

    @property
    def resources(self) -> dict[str, int]:
        # A worker runs at most `amount` tasks of a resource at once: give each pool resource
        # the worker's thread count so its threads all load (one task per thread, not one per worker).
        return {f"pool_{source}": self.threads for source in self.sources}

    @property
    def standby_resources(self) -> dict[str, int]:
        """A standby's resources: no task needs them; promoted, it gets :attr:`resources`' amounts."""
        return {f"standby_{source}": self.threads for source in self.sources}

    def standby_count(self) -> int:
        """How many standbys this pool keeps (its own ``standbys``, else the configured default)."""
        if self.standbys is not None:
            return self.standbys
        from mdata import config

        return int(config.get("cluster.standbys"))


def default_pools(sources: Iterable, *, cheap_group_size: int = 4) -> list[PoolSpec]:
    """A laptop-sized default when no profile was measured: expensive sources get a pool each,
    cheap ones share pools of up to ``cheap_group_size`` sources.

    A source's class is what its transform declares (``SampleTransform.cost_class``: tokenizing
    text is cheap, decoding images expensive; a transform that says nothing is expensive when it
    produces images). A plan-file source whose transform is not mdata's own is "unknown" here
    (reading its class would import the user's code into the scheduler's process) and gets a pool
    of its own, the safe side. The Planner's pool targets say when a source deserves more
    workers; :func:`mdata.pools.layout.compute_layout` lays pools out from measured costs instead.
    """
    from mdata.pools.layout import source_cost_class

    names_cheap, pools = [], []
    for src in sources:
        if source_cost_class(src) == "cheap":
            names_cheap.append(src.name)
        else:
            pools.append(PoolSpec(name=src.name, sources=(src.name,)))
    for i in range(0, len(names_cheap), cheap_group_size):
        group = tuple(names_cheap[i : i + cheap_group_size])
        pools.append(PoolSpec(name=f"text{i // cheap_group_size}", sources=group))
    return pools


def layout_pools(layout_or_pools: "PoolLayout | Iterable[PoolSpec | LayoutPool]",
                 **options: Any) -> list[PoolSpec]:
    """PoolSpecs for a :class:`~mdata.pools.layout.PoolLayout` (or its ``pools``): same names,
    sources, workers and threads; ``options`` (``memory_limit``, ``standbys``) apply to all."""
    pools = getattr(layout_or_pools, "pools", layout_or_pools)
    return [p if isinstance(p, PoolSpec) else
            PoolSpec(name=p.name, sources=tuple(p.sources), workers=int(p.workers),
                     threads=int(p.threads), **options)
            for p in pools]


@dataclass
class MdataCluster:
    """A running embedded cluster: the Dask ``SpecCluster`` plus mdata's pool bookkeeping."""

    cluster: object
    pools: dict[str, PoolSpec] = field(default_factory=dict)
    host: str = "127.0.0.1"  # where new workers of a scaled pool bind
    autoscaler: object = None  # the PoolAutoscaler start_cluster started (mdata.driver.autoscale)

    @property
    def scheduler_address(self) -> str:
        return self.cluster.scheduler_address

    @property
    def dashboard_link(self) -> str:
        return self.cluster.dashboard_link

    @property
    def dashboard_links(self) -> dict[str, str]:
        """Every mdata dashboard page's URL by title (``sources``, ``waiting``...; the table:
        :data:`mdata.observe.dashboard_pages.PAGES`); empty when the cluster serves no dashboard."""
        from mdata.observe.dashboard_pages import page_urls

        link = self.cluster.dashboard_link
        return page_urls(link) if link else {}

    def client(self, **kwargs):
        """A Dask client of this cluster that pulls batches straight from the workers
        (``direct_to_workers``, as the Loader's own clients do); ``kwargs`` go to ``Client``."""
        from distributed import Client

        kwargs.setdefault("direct_to_workers", True)
        return Client(self.cluster, **kwargs)

    def scale_pool(self, pool: str, workers: int) -> None:
        """Set the number of workers of one pool; other pools are untouched.

        Workers are named ``<pool>-<i>``; scaling down removes the highest-numbered ones, which
        the scheduler retires gracefully (their chunks are recomputed elsewhere if still needed).
        """
        spec = self.pools.get(pool)
        if spec is None:
            raise PlanError(f"no pool named {pool!r}; pools: {sorted(self.pools)}")
        if workers < 0:
            raise PlanError(f"pool {pool!r}: cannot scale to {workers} workers")
        worker_spec = self.cluster.worker_spec
        current = sorted(
            (name for name in worker_spec if name.rsplit("-", 1)[0] == pool),
            key=lambda name: int(name.rsplit("-", 1)[1]),
        )
        for name in current[workers:]:
            del worker_spec[name]
        next_index = int(current[-1].rsplit("-", 1)[1]) + 1 if current else 0
        for i in range(len(current), workers):
            worker_spec[f"{pool}-{next_index}"] = _worker(spec.threads, spec.resources, spec.memory_limit, self.host)
            next_index += 1
        self.pools[pool] = dataclasses.replace(spec, workers=workers)
        self.cluster.sync(self.cluster._correct_state)

    def close(self) -> None:
        """Close the jobs first, then the workers and the scheduler. A job still holding its
        chunks and batches when its workers leave makes the scheduler report every one of them
        lost ("will be recomputed elsewhere") and cancel loads mid-task; closed first, it has
        released them and plans nothing more."""
        if self.autoscaler is not None:
            self.autoscaler.stop()  # before the jobs close: it asks them for targets
        self._close_jobs()
        self.cluster.close()

    def _close_jobs(self) -> None:
        """The process that runs the scheduler closes its jobs through the Planner itself: it
        needs no driver's or Loader's identity (close_job asks for one, mdata.planner.callers),
        and each job has released its tasks on the scheduler when this returns."""
        if getattr(self.cluster, "status", None) is None or self.cluster.status.name != "running":
            return  # never started or closing already: nothing to ask
        extensions = getattr(getattr(self.cluster, "scheduler", None), "extensions", None) or {}
        planner = extensions.get("mdata")
        if planner is None:  # a scheduler in another process: its Planner closes them itself
            return
        try:
            self.cluster.sync(planner.close_jobs)
        except OSError:  # the scheduler is gone already: so are its jobs
            pass

    def __enter__(self) -> "MdataCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _worker(threads: int, resources: Mapping[str, int], memory_limit, host: str) -> dict:
    from distributed import Nanny

    from mdata import config

    # The worker's Dask config (the nanny hands it to the process it starts). Dask's profiler
    # samples every thread's stack every 10 ms and keeps the history, in every worker; mdata reads
    # none of it, so it is off unless ``mdata.cluster.worker-profile`` asks for the Profile page.
    profile = bool(config.get("cluster.worker-profile"))
    return {
        "cls": Nanny,
        "options": {
            "nthreads": threads,
            "resources": dict(resources),
            "memory_limit": memory_limit,
            "host": host,
            "dashboard_address": None,
            # a dotted key: the nanny merges this over its own config shallowly
            "config": {"distributed.worker.profile.enabled": profile},
        },
    }


def dashboard_on_host(dashboard_address: str | int | None, host: str) -> str | None:
    """``dashboard_address`` with the scheduler's ``host`` where it names none (``":8787"``,
    ``8787``). Dask binds a host-less dashboard address to every interface (0.0.0.0) whatever host
    the scheduler binds, so a cluster kept on loopback would still show its sources, lineage and
    worker logs to the whole network. An address with a host (``"0.0.0.0:8787"``) is kept."""
    if dashboard_address is None:
        return None
    if ":" in host:  # an IPv6 host: Dask's dashboard addresses cannot spell one; leave it alone
        return str(dashboard_address)
    parts = []
    for part in str(dashboard_address).split(","):
        part = part.strip()
        if part.isdigit():
            part = f"{host}:{part}"
        elif part.startswith(":"):
            part = f"{host}{part}"
        parts.append(part)
    return ",".join(parts)


def start_cluster(
    sources: Sequence,
    *,
    pools: "Sequence[PoolSpec | LayoutPool] | None" = None,
    layout: "PoolLayout | None" = None,
    constructors: int | None = None,
    constructor_threads: int | None = None,
    host: str | None = None,
    dashboard_address: str | None = ":0",
    scheduler_port: int = 0,
    security=None,
    autoscale: bool | None = None,
) -> MdataCluster:
    """Start an embedded cluster for ``sources``: a Planner scheduler, loader pools, constructors.

    Binds to loopback by default (``mdata.cluster.host``), the dashboard too: a
    ``dashboard_address`` without a host (``":0"``, ``":8787"``) binds to ``host``
    (:func:`dashboard_on_host`); give ``"0.0.0.0:8787"`` to serve it on every interface. ``pools`` (PoolSpecs, or a layout's pools) defaults to the pools
    of ``layout`` (a :class:`~mdata.pools.layout.PoolLayout` computed from a profile), else to
    :func:`default_pools`. Every source must be served by some pool, or its load tasks would wait
    forever; that is checked here. ``autoscale``
    (None: ``mdata.cluster.autoscale``, on by default) resizes the pools from the Planner's
    decisions (:class:`~mdata.driver.autoscale.PoolAutoscaler`; ``.autoscaler`` of the result).
    """
    from distributed import Scheduler, SpecCluster

    from mdata import config
    from mdata.distribution import check_runtime_packages

    check_runtime_packages()  # before a scheduler preloads a `scheduler_plugins` that is not ours
    constructors = config.get("cluster.constructors") if constructors is None else constructors
    constructor_threads = (
        config.get("cluster.constructor-threads") if constructor_threads is None else constructor_threads
    )
    host = config.get("cluster.host") if host is None else host
    if pools is not None and layout is not None:
        raise PlanError("give pools or a layout, not both")
    if layout is not None:
        pools = layout.pools
    pools = layout_pools(pools) if pools is not None else default_pools(sources)
    served = {name for pool in pools for name in pool.sources}
    missing = [src.name for src in sources if src.name not in served]
    if missing:
        raise PlanError(f"no pool serves source(s) {missing}; add them to a PoolSpec")
    if constructors < 1:
        raise PlanError("an mdata cluster needs at least one constructor worker")
    dashboard_address = dashboard_on_host(dashboard_address, host)
    workers: dict[str, dict] = {}
    for pool in pools:
        for i in range(pool.workers):
            workers[f"{pool.name}-{i}"] = _worker(pool.threads, pool.resources, pool.memory_limit, host)
        for i in range(pool.standby_count()):  # not counted by scale_pool: '<pool>-standby' differs
            workers[f"{pool.name}-standby-{i}"] = _worker(pool.threads, pool.standby_resources,
                                                           pool.memory_limit, host)
    for i in range(constructors):
        workers[f"constructor-{i}"] = _worker(
            constructor_threads, {CONSTRUCTOR_RESOURCE: constructor_threads},
            config.get("cluster.worker-memory-limit"), host,
        )
    scheduler_options = {
        "host": host,
        "port": scheduler_port,
        "dashboard": dashboard_address is not None,
        "dashboard_address": dashboard_address,
        "preload": [PLANNER_PRELOAD],
    }
    if security is not None:
        scheduler_options["security"] = security
        for spec in workers.values():
            spec["options"]["security"] = security
    cluster = SpecCluster(
        workers=workers,
        scheduler={"cls": Scheduler, "options": scheduler_options},
        security=security,
        name="mdata",
    )
    out = MdataCluster(cluster=cluster, pools={p.name: p for p in pools}, host=host)
    if config.get("cluster.autoscale") if autoscale is None else autoscale:
        out.autoscaler = PoolAutoscaler(out).start()
    return out
