"""Fixtures of the standby tests: one real multi-host Spark cluster per test session."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from cluster import ClusterUnavailableError, MultiHostCluster


@pytest.fixture(scope="session")
def cluster_session() -> Iterator[MultiHostCluster]:
    """Master plus three workers on 127.0.0.2-4, each with a private disk and two cores (executors have
    one, but for the Invariant 2 test); stopped at session end."""
    cluster = MultiHostCluster(workers=3, worker_cores=2)
    try:
        cluster.start()
    except ClusterUnavailableError as error:
        pytest.skip(f"no multi-host cluster here: {error}")
    yield cluster
    cluster.stop()
    shutil.rmtree(cluster.root, ignore_errors=True)


@pytest.fixture
def multihost_cluster(cluster_session: MultiHostCluster) -> MultiHostCluster:
    """The session's cluster with every host up (a previous test may have killed some)."""
    for i in range(cluster_session.workers):
        cluster_session.start_host(i)
    return cluster_session
