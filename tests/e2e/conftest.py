"""The e2e suite's fixtures: the real control plane (started unless `make e2e-up` already runs
it, and stopped again at the end only when this session started it), its admin view, and the
CRD installed the way a user installs it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from e2e import controlplane

from .cluster import ROOT, Cluster


@pytest.fixture(scope="session")
def control_plane() -> Iterator[controlplane.State]:
    was_running = controlplane.load_state() is not None
    state = controlplane.up()
    yield state
    if not was_running:
        controlplane.down()


@pytest.fixture(scope="session")
def cluster(control_plane: controlplane.State) -> Cluster:
    return Cluster(control_plane)


@pytest.fixture(scope="session")
def crd_installed(cluster: Cluster) -> Cluster:
    """`kubectl apply -f crds/`, as the README tells users, and wait until it is served."""
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", "crd/vgpupolicies.vgpu.io", "--timeout=60s")
    return cluster
