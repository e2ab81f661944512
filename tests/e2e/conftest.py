"""The e2e suite's fixtures: the real control planes (each started unless `make e2e-up` already
runs it, and stopped again at the end only when this session started it), their admin view, and
the CRD installed the way a user installs it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from e2e import controlplane

from .cluster import ROOT, Cluster


def _running(instance: controlplane.Instance) -> Iterator[controlplane.State]:
    was_running = controlplane.load_state(instance) is not None
    state = controlplane.up(instance)
    yield state
    if not was_running:
        controlplane.down(instance)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[controlplane.State]:
    """The current Kubernetes release, with a controller-manager."""
    yield from _running(controlplane.CURRENT)


@pytest.fixture(scope="session")
def oldest_control_plane() -> Iterator[controlplane.State]:
    """The oldest release the README claims (API server only)."""
    yield from _running(controlplane.OLDEST)


@pytest.fixture(scope="session")
def cluster(control_plane: controlplane.State) -> Cluster:
    return Cluster(control_plane)


def _with_crd(cluster: Cluster) -> Cluster:
    """`kubectl apply -f crds/`, as the README tells users, and wait until it is served."""
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    cluster.wait_established("vgpupolicies.vgpu.io")
    return cluster


@pytest.fixture(scope="session")
def crd_installed(cluster: Cluster) -> Cluster:
    return _with_crd(cluster)


@pytest.fixture(scope="session", params=["current", "oldest"])
def crd_server(request: pytest.FixtureRequest) -> Cluster:
    """The CRD on each supported release: the checks that broke on a real server run on both."""
    if request.param == "current":
        installed: Cluster = request.getfixturevalue("crd_installed")
        return installed
    return _with_crd(Cluster(request.getfixturevalue("oldest_control_plane")))
