"""policy -> rendered config -> device plugin registration -> binder annotations -> Allocate env
-> hook enforcement, on the embedded seed-001 cluster (the chain `vgpuctl demo` narrates)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import yaml
from vgpu_formats import annotations as ann
from vgpu_formats import device_config as dc
from vgpuctl import chain
from vgpuctl.binder import Placement
from vgpuctl.doctor import diagnose
from vgpuctl.importer import import_policy
from vgpuctl.main import main
from vgpuctl.manifests import load_objects

from tests.support.required import unavailable

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GPU_7 = "GPU-bc94e532-1820-8ee8-ceaa-704166369c7c"
GPU_6 = "GPU-bc47d475-3538-d3eb-f4ba-e46e2639c54c"


def test_embedded_demo_cluster_is_the_fixtures():
    """The demo ships its own copy (no tests/ at run time); it must not drift from the fixtures."""
    shipped = load_objects([chain.DEMO_CLUSTER])
    fixtures = load_objects([FIXTURES / "cluster", FIXTURES / "scenarios"])
    assert shipped == fixtures


async def test_whole_chain(tmp_path):
    async with chain.cluster() as running:
        facts = await chain.read_facts(running)
        assert "resource-name-mismatch" in {f.code for f in diagnose(facts).findings}

        # 1. policy -> rendered config: the operator makes the plugin register the scheduler's name.
        imported = import_policy(facts)
        assert imported.policy["spec"]["resources"]["count"] == "nvidia.com/gpu"
        async with chain.operator(running):
            status = await chain.apply_policy(running, imported.policy)
            assert status["observedGeneration"] >= 1
            written = chain.writes(running)
            assert "PATCH /apis/apps/v1/namespaces/kube-system/daemonsets/volcano-device-plugin" in written
            assert "PATCH /api/v1/namespaces/kube-system/configmaps/volcano-vgpu-node-config" not in written
            ds = running.emulator.get_object("DaemonSet", "kube-system", "volcano-device-plugin")
            args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
            assert "--resource-name=nvidia.com/gpu" in args and "--device-split-count=10" in args
            conf = running.emulator.get_object("ConfigMap", "volcano-system", "volcano-scheduler-configmap")
            text = conf["data"]["volcano-scheduler.conf"]
            assert "deviceshare.KnownGeometriesCMNamespace: kube-system" in text
            assert "capacity-card" in text  # other plugins kept

            # 2. device plugin registration, from the rendered device-config.
            async with contextlib.AsyncExitStack() as stack:
                agents = {node: await stack.enter_async_context(chain.node_agent(running, node, tmp_path))
                          for node in ("dev-app-2-150-master-1", "test-app-64-46-msxf")}
                agent = agents[chain.DEMO_NODE]
                assert agent.names == ["nvidia.com/gpu", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores"]
                assert agent.advertised()["nvidia.com/gpu"] == 8 * 10
                node = running.emulator.get_object("Node", None, chain.DEMO_NODE)
                devices = ann.decode_node_register(node["metadata"]["annotations"][ann.NODE_REGISTER])
                assert [d.count for d in devices] == [10] * 8
                for each in agents.values():
                    chain.publish_allocatable(running, each)

                # 3. binder annotations (the seed's failed pod is deleted first, as doctor advises).
                assert await chain.delete_pod(running, "volcano-system", "test-vgpu-compatible")
                facts = await chain.read_facts(running)
                pod = chain.demo_pod(facts)
                assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
                placement = await chain.schedule(running, pod)
                assert isinstance(placement, Placement), placement
                expected = f"{GPU_7},NVIDIA,3000,50:{GPU_6},NVIDIA,3000,50:"
                assert placement.node == chain.DEMO_NODE
                assert placement.annotations[ann.DEVICES_TO_ALLOCATE] == expected
                assert placement.annotations[ann.BIND_PHASE] == "allocating"

                # 4. Allocate env.
                allocation = await chain.allocate(agent, "nvidia.com/gpu", 2)
                envs = allocation["envs"]
                assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
                assert envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "3000m"
                assert envs["CUDA_DEVICE_SM_LIMIT"] == "50"
                assert envs["NVIDIA_VISIBLE_DEVICES"] == f"{GPU_7},{GPU_6}"
                bound = running.emulator.get_object("Pod", "default", "vgpu-demo")
                assert bound["metadata"]["annotations"][ann.BIND_PHASE] == "success"
                assert bound["metadata"]["annotations"][ann.DEVICES_TO_ALLOCATE] == ""

                # The cluster is consistent now: doctor finds nothing to fix.
                after = diagnose(await chain.read_facts(running))
                assert after.problems == 0, [(f.code, f.message) for f in after.findings]
                assert after.names["devicePlugin"]["count"] == "nvidia.com/gpu"

    # 5. hook enforcement (needs hook/build; `make test` builds it before pytest runs).
    found = chain.hook_artifacts()
    if isinstance(found, str):
        unavailable(f"hook step: {found}")
    hook = chain.run_hook(envs, tmp_path)
    assert hook.ran and hook.returncode == 0, hook
    # 500 MiB steps: six fit under the 3000 MiB cap Allocate set, the seventh is refused.
    assert "start: device 0, cuMemGetInfo free 3000 MiB / total 3000 MiB" in hook.output
    refused = "step 7: cuMemAlloc 500 MiB -> CUDA_ERROR_OUT_OF_MEMORY"
    assert any(line.startswith(refused) for line in hook.output)
    assert "refused at step 7 with 3000 MiB held" in hook.output


def test_unrecognised_pod_is_not_annotated():
    """Before the fix: the seed's pod (nvidia.com/gpu) with the default names is not a vGPU pod."""
    objects = load_objects([FIXTURES / "cluster"])
    facts_pod = next(o for o in objects if o["kind"] == "Pod")
    facts_pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "2"}
    from vgpuctl.binder import SchedulerSettings, Unschedulable, bind

    nodes = [o for o in objects if o["kind"] == "Node"]
    result = bind(facts_pod, nodes, [], SchedulerSettings(count_name=dc.DEFAULT_COUNT_NAME), now=1)
    assert isinstance(result, Unschedulable) and "not a vGPU pod" in result.message


def test_demo_command_reports_every_step(capsys):
    assert main(["demo", "-o", "json", "--no-hook"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["ok"] is True
    assert [s["step"] for s in record["steps"]] == [1, 2, 3, 4, 5, 6, 7]
    assert record["seconds"] < 30
    assert record["doctorAfter"]["healthy"] is True
    assert record["steps"][6]["hook"]["reason"] == "skipped (--no-hook)"


def test_import_render_diff_round_trip(tmp_path, capsys):
    """Once the operator has written the canonical form, importing again changes nothing."""
    cluster = ["-c", str(FIXTURES / "cluster"), "-c", str(FIXTURES / "scenarios")]
    assert main(["import", *cluster]) == 0
    policy = tmp_path / "policy.yaml"
    policy.write_text(capsys.readouterr().out)
    assert main(["render", "-f", str(policy), *cluster, "-o", "json"]) == 0
    rendered = json.loads(capsys.readouterr().out)
    applied = tmp_path / "applied.yaml"
    applied.write_text(yaml.safe_dump_all(rendered))
    sources = [*cluster, "-c", str(applied)]
    assert main(["import", *sources]) == 0
    again = capsys.readouterr().out
    assert yaml.safe_load(again)["spec"] == yaml.safe_load(policy.read_text())["spec"]
    assert main(["diff", "-f", str(policy), *sources]) == 0
    assert "nothing to change" in capsys.readouterr().out
