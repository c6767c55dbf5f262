"""What an embedded cluster exposes under its defaults: every process (the scheduler and its
dashboard, the nannies, the loader and constructor workers) listens on loopback only, as the
printed addresses say. Read from the kernel's socket tables for the cluster's own PIDs."""

from __future__ import annotations

import os
from urllib.parse import urlparse

import pytest
from fixtures_sockets import listening, not_loopback, process_tree

pytestmark = pytest.mark.cluster


def test_an_embedded_cluster_listens_on_loopback_only_under_its_defaults(example_sources_small):
    from mdata.driver import start_cluster

    sources = [s for s in example_sources_small if s.name in ("chat", "code")]
    with start_cluster(sources) as cluster, cluster.client(set_as_default=False) as client:
        # the scheduler and the nannies run in this process; each worker in a process of its own
        worker_pids = set(client.run(os.getpid).values())
        pids = process_tree(os.getpid())
        assert worker_pids and worker_pids <= set(pids)
        sockets = listening(pids)
        dashboard = urlparse(cluster.dashboard_link)
        scheduler = urlparse(cluster.scheduler_address)
        ours = sockets[os.getpid()]
        ports = {port for _, port in ours}
        assert dashboard.hostname == scheduler.hostname == "127.0.0.1"
        assert scheduler.port in ports and dashboard.port in ports, (cluster.dashboard_link, ours)
        for pid in worker_pids:  # each worker listens (its comm), on loopback
            assert sockets[pid], f"worker {pid} listens on nothing"
        assert not_loopback(sockets) == {}, sockets
