"""The chart README's values for a platform that assigns the uid itself (OpenShift's restricted
SCC) on a real server: the operator's Deployment is accepted, and the controller-manager's pod for
it passes Pod Security admission's `restricted` profile without a runAsUser of ours."""

from __future__ import annotations

import copy
import json
import pathlib
import re
from typing import Any

from tests.support.waiting import eventually_sync

from .cluster import Cluster
from .release import CHART, SCHEDULER_NS

RELEASE = "vgpu-scc"


def readme_values() -> str:
    """The values the chart README gives in "OpenShift and other platforms that pick the uid"."""
    section = (CHART / "README.md").read_text().split("## OpenShift", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert block is not None, "the README section lost its values"
    return block.group(1)


def operator_pods(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    return cluster.items("pods", namespace, selector="app.kubernetes.io/component=operator")


def test_the_operator_runs_with_the_uid_left_to_the_platform(crd_installed: Cluster,
                                                              tmp_path: pathlib.Path) -> None:
    cluster = crd_installed
    cluster.ensure_namespace(SCHEDULER_NS)
    namespace = cluster.namespace("vgpu-scc")
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    values = tmp_path / "platform.yaml"
    values.write_text(readme_values())
    try:
        # The device plugin mounts host paths, which no restricted profile admits: left out here.
        cluster.helm("install", RELEASE, str(CHART), "-n", namespace, "-f", str(values),
                     "--set", "devicePlugin.enabled=false", "--set", "policy.create=false")
        pods = eventually_sync(lambda: operator_pods(cluster, namespace),
                               what="the operator pod created by the ReplicaSet under enforce=restricted")
        spec = pods[0]["spec"]
        assert spec["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
        assert "runAsUser" not in spec["containers"][0]["securityContext"]

        # The profile is enforced: the same pod with runAsNonRoot dropped is refused.
        bare = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare", "namespace": namespace},
                "spec": copy.deepcopy(spec)}
        bare["spec"].pop("nodeName", None)
        del bare["spec"]["securityContext"]["runAsNonRoot"]
        del bare["spec"]["containers"][0]["securityContext"]["runAsNonRoot"]
        refused = cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(bare),
                                  check=False)
        assert refused.returncode != 0 and 'violates PodSecurity "restricted' in refused.stderr
    finally:
        cluster.helm("uninstall", RELEASE, "-n", namespace, "--wait", check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
