"""The chart README's CRD upgrade path on a real server, for a user without the operator's help
(`operator.manageCRD=false`) and without a checkout: an older chart installed the CRD (helm writes
crds/ once), then the commands of "Upgrades and uninstall" bring the served schema to this one."""

from __future__ import annotations

import copy
import json
import pathlib
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from vgpu_operator import api, crd

from .cluster import Cluster
from .release import CHART, SCHEDULER_NS

RELEASE = "vgpu-crd"
LEGACY = "legacyField"


def older_crd() -> dict[str, Any]:
    """This CRD as an older release shipped it: no `-o wide` columns, a column and a spec field
    since removed, conditions that do not require a reason, an older version and revision."""
    older = copy.deepcopy(crd.crd_manifest())
    older["metadata"]["annotations"] = {crd.VERSION_ANNOTATION: "0.0.1", crd.REVISION_ANNOTATION: "older"}
    version = older["spec"]["versions"][0]
    version["additionalPrinterColumns"] = [
        *[c for c in version["additionalPrinterColumns"] if not c.get("priority")],
        {"name": "Legacy", "type": "string", "jsonPath": f".spec.{LEGACY}"}]
    root = version["schema"]["openAPIV3Schema"]["properties"]
    root["spec"]["properties"][LEGACY] = {"type": "string", "description": "Gone in later releases."}
    item = root["status"]["properties"]["conditions"]["items"]
    item["required"] = ["type", "status"]
    item["properties"]["reason"] = {"type": "string", "maxLength": 1024, "default": "",
                                    "description": "CamelCase reason."}
    return older


def served(cluster: Cluster) -> dict[str, Any]:
    found = cluster.get("crd", crd.CRD_NAME)
    assert found is not None, "the CRD is gone"
    return found


def older_chart(tmp: pathlib.Path) -> pathlib.Path:
    """A copy of the chart whose crds/ holds `older_crd` (the symlink copied as a file)."""
    chart = tmp / "older" / CHART.name
    shutil.copytree(CHART, chart)
    crd_file = chart / "crds" / f"{api.GROUP}_{api.PLURAL}.yaml"
    crd_file.write_text(yaml.safe_dump(older_crd(), sort_keys=False))
    return chart


def drop_crd(cluster: Cluster) -> None:
    """Delete the CRD (with every policy: none may wait on a finalizer no operator removes), so
    that helm installs the older one as it does on a fresh cluster."""
    for name in cluster.kubectl("get", "vgpupolicies", "-o", "name", check=False).stdout.split():
        cluster.kubectl("patch", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False)
    cluster.kubectl("delete", "crd", crd.CRD_NAME, "--ignore-not-found", "--wait=true", "--timeout=60s")


@pytest.fixture
def older_release(crd_installed: Cluster, tmp_path: pathlib.Path) -> Iterator[tuple[Cluster, str]]:
    """An older chart installed with manageCRD=false into a fresh namespace; on the way out the
    release and namespace go, and the CRD the rest of the suite expects is put back."""
    cluster = crd_installed
    cluster.ensure_namespace(SCHEDULER_NS)
    namespace = f"vgpu-crd-{uuid.uuid4().hex[:6]}"
    drop_crd(cluster)
    try:
        cluster.helm("install", RELEASE, str(older_chart(tmp_path)), "-n", namespace, "--create-namespace",
                     "--set", "operator.manageCRD=false", "--set", "policy.create=false")
        yield cluster, namespace
    finally:
        cluster.helm("uninstall", RELEASE, "-n", namespace, "--wait", check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "vgpupolicies", "--all", "--wait=false", check=False)
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd.CRD_PATH))
        cluster.wait_established(crd.CRD_NAME)


def test_the_documented_commands_upgrade_a_crd_helm_installed(older_release: tuple[Cluster, str]) -> None:
    cluster, namespace = older_release
    before = json.loads(cluster.kubectl("get", "crd", crd.CRD_NAME, "-o", "json",
                                        "--show-managed-fields").stdout)
    assert before["metadata"]["annotations"][crd.REVISION_ANNOTATION] == "older"
    managers = {m["manager"] for m in before["metadata"]["managedFields"] if m["operation"] != "Update"
                or m.get("subresource") != "status"}
    assert managers == {"helm"}, f"the fixture is not what helm leaves: {managers}"
    policy = f"upgraded-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(
        {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": policy}, "spec": {}}))

    # README "Upgrades and uninstall", manageCRD=false: the new chart's CRDs first, then the chart.
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                    stdin=cluster.helm("show", "crds", str(CHART)).stdout)
    cluster.helm("upgrade", RELEASE, str(CHART), "-n", namespace, "--reuse-values")

    after = served(cluster)
    ours = crd.crd_manifest()
    assert after["metadata"]["annotations"] == ours["metadata"]["annotations"]
    # Exactly this schema: what the older one added is gone (not merged in), what it lacked is served.
    version = after["spec"]["versions"][0]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == \
        [c["name"] for c in ours["spec"]["versions"][0]["additionalPrinterColumns"]]
    root = version["schema"]["openAPIV3Schema"]["properties"]
    assert LEGACY not in root["spec"]["properties"]
    assert "reason" in root["status"]["properties"]["conditions"]["items"]["required"]
    header = cluster.kubectl("get", "vgpupolicy", policy, "-o", "wide").stdout.splitlines()[0].split()
    assert header[-2:] == ["REASON", "MESSAGE"] and "LEGACY" not in header
    assert cluster.get("vgpupolicy", policy) is not None, "the stored policy survives the upgrade"
