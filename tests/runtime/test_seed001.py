"""Seed 001: pods requesting nvidia.com/gpu fail with `device request not found` because the
device-config says nvidia.com/gpu while the legacy plugin registers volcano.sh/vgpu-number."""

from __future__ import annotations

from tests.support.waiting import eventually

from .conftest import Cluster


async def test_policy_brings_the_plugin_flags_in_line_and_status_names_the_mismatch(seed001: Cluster) -> None:
    seed001.create_policy(spec={"resources": {"count": "nvidia.com/gpu"}})
    nodes = await eventually(lambda: (c := seed001.condition("NodesReady")).get("status") == "False" and c,
                             what="NodesReady=False")

    ds = seed001.get("DaemonSet", "kube-system", "volcano-device-plugin")
    assert ds is not None
    args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--resource-name=nvidia.com/gpu" in args, "the legacy plugin must register what device-config says"
    assert "node advertises volcano.sh/vgpu-number but policy says nvidia.com/gpu" in nodes["message"]
    mismatched = seed001.status()["nodes"]["mismatched"]
    assert {m["name"] for m in mismatched} == {"dev-app-2-150-master-1", "test-app-64-46-msxf"}

    # The plugin restarts with the new flag and re-registers: the node converges.
    def advertise_new_name(node: dict[str, object]) -> None:
        allocatable = node["status"]["allocatable"]  # type: ignore[index]
        allocatable["nvidia.com/gpu"] = allocatable.pop("volcano.sh/vgpu-number")

    for name in ("dev-app-2-150-master-1", "test-app-64-46-msxf"):
        seed001.edit("Node", None, name, advertise_new_name)
    await seed001.ready()
