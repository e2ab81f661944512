"""The chart's life cycle on a real server: uninstall, adopting an existing plugin, upgrade."""

from __future__ import annotations

import pathlib

from tests.support.waiting import eventually_sync

from .cluster import Cluster
from .release import RELEASE, SCHEDULER_NS, installed


def test_uninstall_leaves_a_working_cluster(crd_installed: Cluster, tmp_path: pathlib.Path) -> None:
    cluster = crd_installed
    with installed(cluster, tmp_path) as release:
        release.ready()
        namespace = release.namespace
    # What the operator rendered stays (the scheduler keeps working), the release's own objects
    # and its namespace are gone, and the CRD stays for the next install.
    eventually_sync(lambda: cluster.get("namespace", namespace) is None, what=f"{namespace} deleted")
    assert cluster.items("clusterroles", selector=f"app.kubernetes.io/instance={RELEASE}") == []
    assert cluster.items("roles", selector=f"app.kubernetes.io/instance={RELEASE}") == []
    assert cluster.get("configmap", "volcano-vgpu-device-config", "kube-system") is not None
    conf = cluster.get("configmap", "volcano-scheduler-configmap", SCHEDULER_NS)
    assert conf is not None and "deviceshare" in conf["data"]["volcano-scheduler.conf"]
    assert cluster.get("crd", "vgpupolicies.vgpu.io") is not None
    assert cluster.items("vgpupolicies") == []
