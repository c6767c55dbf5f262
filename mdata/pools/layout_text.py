"""A pool layout as text: a table for people, ``dask worker`` lines and a Kubernetes manifest for
deployments beyond one machine.

The embedded cluster runs a layout directly (``start_cluster(sources, layout=...)``); elsewhere the
same pools are worker processes started by hand, by Slurm or by the dask-kubernetes operator. So a
layout prints as commands that start exactly its pools: each pool's workers declare
``pool_<source>=THREADS`` for every source they serve (a worker runs at most that many load tasks
at once, one per thread), and the scheduler preloads the Planner. A cluster on TLS (``tls``: the CA,
certificate and key paths as they are on the hosts) prints every line with the dask CLI's
``--tls-ca-file/--tls-cert/--tls-key`` and a ``tls://`` scheduler address, and its manifest mounts
them from a Secret.
"""

from __future__ import annotations

from mdata.pools.layout import PoolLayout

__all__ = ["dask_worker_commands", "kubernetes_manifest", "tls_options", "TLS_MOUNT"]

TLS_MOUNT = "/etc/mdata/tls"  # where the manifest mounts the TLS Secret (ca.pem, cert.pem, key.pem)


def tls_options(tls: "tuple[str, str, str] | None") -> list[str]:
    """The dask CLI's TLS options for ``tls`` = (CA file, certificate, key); none without TLS."""
    if tls is None:
        return []
    ca, cert, key = tls
    return ["--tls-ca-file", ca, "--tls-cert", cert, "--tls-key", key]


def _resources(pool) -> str:
    return " ".join(f"{k}={v}" for k, v in pool.resources.items())


def dask_worker_commands(layout: PoolLayout, scheduler: str = "tcp://SCHEDULER:8786", *,
                         constructors: int = 2, constructor_threads: int = 2,
                         memory_limit: str = "4GiB",
                         tls: "tuple[str, str, str] | None" = None) -> list[str]:
    """Shell lines that start the layout with the dask CLI: the scheduler, each pool's workers,
    the constructors; with ``tls``, each line carries the certificates and the scheduler listens
    on ``tls://`` (a ``tcp://`` ``scheduler`` address is turned into its ``tls://`` twin)."""
    opts = "".join(f" {o}" for o in tls_options(tls))
    if tls is not None and scheduler.startswith("tcp://"):
        scheduler = "tls://" + scheduler[len("tcp://"):]
    lines = ["dask scheduler --preload scheduler_plugins.planner" + (" --protocol tls" + opts if tls else "")]
    for p in layout.pools:
        lines.append(f'dask worker {scheduler} --nworkers {p.workers} --nthreads {p.threads} '
                     f'--memory-limit {memory_limit} --resources "{_resources(p)}" --name {p.name}{opts}')
    lines.append(f'dask worker {scheduler} --nworkers {constructors} --nthreads {constructor_threads} '
                 f'--resources "mdata_constructor={constructor_threads}" --name constructor{opts}')
    return lines


def kubernetes_manifest(layout: PoolLayout, *, cluster: str = "mdata", image: str = "IMAGE",
                        constructors: int = 2, constructor_threads: int = 2,
                        memory_limit: str = "4GiB", tls: bool = False) -> str:
    """A dask-kubernetes operator manifest (``kubernetes.dask.org/v1``): a ``DaskCluster`` whose
    default worker group is the constructors, and one ``DaskWorkerGroup`` per pool, each asking
    for as many CPUs as it runs threads. With ``tls``, every container mounts the Secret
    ``<cluster>-tls`` (``ca.pem``, ``cert.pem``, ``key.pem``) at :data:`TLS_MOUNT` and passes the
    dask CLI's TLS options; the scheduler listens on ``tls://`` and workers dial it there."""
    mount = (f"{TLS_MOUNT}/ca.pem", f"{TLS_MOUNT}/cert.pem", f"{TLS_MOUNT}/key.pem") if tls else None
    tls_args = "".join(f", {o}" for o in tls_options(mount))
    volume = [
        "          volumeMounts: [{name: tls, mountPath: " + TLS_MOUNT + ", readOnly: true}]",
    ] if tls else []
    volumes = [f"      volumes: [{{name: tls, secret: {{secretName: {cluster}-tls, defaultMode: 0400}}}}]"] if tls else []
    dial = f", tls://{cluster}-scheduler:8786" if tls else ""

    def container(threads: int, resources: str) -> list[str]:
        return [
            "      containers:",
            "        - name: worker",
            f"          image: {image}",
            f"          args: [dask, worker{dial}, --name, $(DASK_WORKER_NAME), --nthreads, "
            f'"{threads}", --memory-limit, {memory_limit}, --resources, "{resources}"{tls_args}]',
            f"          resources: {{requests: {{cpu: \"{threads}\", memory: {memory_limit}}}, "
            f"limits: {{cpu: \"{threads}\", memory: {memory_limit}}}}}",
            *volume,
            *volumes,
        ]

    head = ([f"# TLS: kubectl create secret generic {cluster}-tls --from-file=ca.pem=CA "
             "--from-file=cert.pem=CERT --from-file=key.pem=KEY"] if tls else [])
    out = [*head,
        "apiVersion: kubernetes.dask.org/v1",
        "kind: DaskCluster",
        "metadata:",
        f"  name: {cluster}",
        "spec:",
        "  scheduler:",
        "    spec:",
        "      containers:",
        "        - name: scheduler",
        f"          image: {image}",
        "          args: [dask, scheduler, --preload, scheduler_plugins.planner"
        + (", --protocol, tls" + tls_args if tls else "") + "]",
        "          ports:",
        "            - {name: tcp-comm, containerPort: 8786}",
        "            - {name: http-dashboard, containerPort: 8787}",
        *volume,
        *volumes,
        "    service:",
        "      type: ClusterIP",
        f"      selector: {{dask.org/cluster-name: {cluster}, dask.org/component: scheduler}}",
        "      ports:",
        "        - {name: tcp-comm, port: 8786, targetPort: tcp-comm}",
        "        - {name: http-dashboard, port: 8787, targetPort: http-dashboard}",
        "  worker:                      # the default group: constructors",
        f"    replicas: {constructors}",
        "    spec:",
        *container(constructor_threads, f"mdata_constructor={constructor_threads}"),
    ]
    for p in layout.pools:
        out += [
            "---",
            "apiVersion: kubernetes.dask.org/v1",
            "kind: DaskWorkerGroup",
            "metadata:",
            f"  name: {cluster}-pool-{p.name.replace('_', '-')}",
            f"  annotations: {{mdata.sources: \"{','.join(p.sources)}\"}}",
            "spec:",
            f"  cluster: {cluster}",
            "  worker:",
            f"    replicas: {p.workers}",
            "    spec:",
            *container(p.threads, _resources(p)),
        ]
    return "\n".join(out) + "\n"
