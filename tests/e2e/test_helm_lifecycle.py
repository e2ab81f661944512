"""The chart's life cycle on a real server: uninstall, adopting an existing plugin, upgrade."""

from __future__ import annotations

import copy
import json
import pathlib
from typing import Any

from vgpu_operator import crd

from tests.support.waiting import eventually_sync

from .cluster import ROOT, Cluster
from .release import CHART, RELEASE, SCHEDULER_NS, installed, operator_args

FIXTURES = ROOT / "tests" / "fixtures" / "cluster"


def _older_crd() -> dict[str, Any]:
    """Our CRD as an earlier release would have shipped it: a printer column fewer, an older
    version and revision."""
    older = copy.deepcopy(crd.crd_manifest())
    version = older["spec"]["versions"][0]
    columns = version["additionalPrinterColumns"]
    version["additionalPrinterColumns"] = [c for c in columns if c["name"] != "Drift"]
    older["metadata"]["annotations"] = {crd.VERSION_ANNOTATION: "0.0.1", crd.REVISION_ANNOTATION: "older"}
    return older


def _served_revision(cluster: Cluster) -> str:
    served = cluster.get("crd", crd.CRD_NAME) or {}
    return str(served.get("metadata", {}).get("annotations", {}).get(crd.REVISION_ANNOTATION, ""))


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


def test_helm_upgrade_brings_a_changed_crd_with_it(crd_installed: Cluster, tmp_path: pathlib.Path) -> None:
    cluster = crd_installed
    ours = crd.crd_manifest()["metadata"]["annotations"][crd.REVISION_ANNOTATION]
    with installed(cluster, tmp_path) as release:
        release.ready()
        cluster.kubectl("replace", "-f", "-", stdin=json.dumps(_older_crd()))
        assert _served_revision(cluster) == "older"
        release.upgrade("--set", "logging.level=debug")
        eventually_sync(lambda: _served_revision(cluster) == ours, what="the CRD upgraded by the operator")
        header = cluster.kubectl("get", "vgpupolicy").stdout.splitlines()[0].split()
        assert "DRIFT" in header, "the upgraded CRD's printer columns are served"
        release.ready()
        assert "--log-level=debug" in operator_args(cluster, release.namespace), "the new args run"


def test_without_manage_crd_the_documented_command_upgrades_it(crd_installed: Cluster,
                                                               tmp_path: pathlib.Path) -> None:
    cluster = crd_installed
    ours = crd.crd_manifest()["metadata"]["annotations"][crd.REVISION_ANNOTATION]
    with installed(cluster, tmp_path, "--set", "operator.manageCRD=false") as release:
        release.ready()
        cluster.kubectl("replace", "-f", "-", stdin=json.dumps(_older_crd()))
        release.upgrade()
        eventually_sync(lambda: "could not be updated" in release.log.read_text(),
                        what="the operator saying the CRD is out of date and how to fix it")
        assert crd.CRD_FIX_FORBIDDEN in release.log.read_text(), "refused (403): the command, or manageCRD"
        assert _served_revision(cluster) == "older", "no right to patch it: left as it was"
        # The README's command for this case: the CRDs of the chart being installed.
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                        stdin=cluster.helm("show", "crds", str(CHART)).stdout)
        assert _served_revision(cluster) == ours


def test_adopting_an_existing_upstream_plugin(crd_installed: Cluster, tmp_path: pathlib.Path) -> None:
    cluster = crd_installed
    cluster.kubectl("apply", "-f", str(FIXTURES / "volcano-vgpu-device-plugin.yaml"))
    with installed(cluster, tmp_path, "--set", "devicePlugin.enabled=false") as release:
        policy = release.ready()
        assert policy["spec"]["devicePlugin"]["namespace"] == "kube-system"
        node_config = cluster.data("volcano-vgpu-node-config", "kube-system", "config.json")
        assert json.loads(node_config)["nodeconfig"] is not None
        # Nothing of ours runs: the release namespace holds no DaemonSet, the upstream one is patched.
        assert cluster.items("daemonsets", release.namespace) == []
        assert cluster.get("daemonset", "volcano-device-plugin", "kube-system") is not None
