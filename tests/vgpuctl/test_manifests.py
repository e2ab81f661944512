"""Reading manifests: overlays, List objects, the doctor's trimmed fast path, clear errors."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from vgpuctl import manifests
from vgpuctl.doctor import DoctorPrefilter
from vgpuctl.manifests import ManifestError, load_objects, trim_document

from .conftest import CLUSTER, SEED001

NODE_TEXT = (CLUSTER / "nodes.yaml").read_text()


def test_overlay_replaces_same_kind_namespace_name_and_keeps_order():
    base = load_objects([CLUSTER])
    both = load_objects([CLUSTER, SEED001])
    assert [manifests.object_key(o) for o in both[: len(base)]] == [manifests.object_key(o) for o in base]
    device_config = next(o for o in both if o["metadata"]["name"] == "volcano-vgpu-device-config")
    assert "nvidia.com/gpu" in device_config["data"]["device-config.yaml"]
    assert any(o["metadata"]["name"] == "test-vgpu-compatible" for o in both)


def test_list_objects_and_json_files(tmp_path: Path):
    pods = [o for o in load_objects([CLUSTER]) if o["kind"] == "Pod"]
    (tmp_path / "list.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": pods}))
    import json

    node = yaml.safe_load_all(NODE_TEXT).__next__()
    (tmp_path / "node.json").write_text(json.dumps(node))
    loaded = load_objects([tmp_path])
    assert [o["kind"] for o in loaded] == ["Pod", "Node"]
    # The doctor's fast path leaves JSON alone (it cannot trim flow style) and still reads it.
    fast = load_objects([tmp_path], DoctorPrefilter())
    # Items of a List are not filtered (the prefilter sees one List document); doctor judges them later.
    assert [o["kind"] for o in fast] == ["Pod", "Node"]
    assert fast[1]["metadata"]["annotations"] == node["metadata"]["annotations"]


def test_trimmed_node_keeps_exactly_what_doctor_reads():
    documents = manifests._DOCUMENT_SEPARATOR.split(NODE_TEXT)
    for full, doc in zip(yaml.safe_load_all(NODE_TEXT), documents, strict=True):
        trimmed = yaml.safe_load(trim_document(doc, DoctorPrefilter.NODE_FIELDS))
        assert trimmed["metadata"] == {k: full["metadata"][k] for k in ("name", "labels", "annotations")}
        assert trimmed["status"] == {"allocatable": full["status"]["allocatable"]}
        assert "spec" not in trimmed


def test_trim_handles_indentless_lists_block_scalars_and_other_indents():
    text = (
        "apiVersion: v1\nkind: Node\nmetadata:\n    name: n1\n    finalizers:\n    - a\n    - b\n"
        "    annotations:\n        note: |\n            name: not-a-key\n            x\n"
        "    managedFields:\n    - manager: kubelet\nspec:\n    taints: []\nstatus:\n    images:\n"
        "    - names: [x]\n    allocatable:\n        cpu: '1'\n"
    )
    keep = {"apiVersion": None, "kind": None, "metadata": frozenset({"name", "annotations"}),
            "status": frozenset({"allocatable"})}
    assert yaml.safe_load(trim_document(text, keep)) == {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "n1", "annotations": {"note": "name: not-a-key\nx\n"}},
        "status": {"allocatable": {"cpu": "1"}},
    }


def test_prefilter_skips_pods_doctor_does_not_explain(tmp_path: Path):
    pod = next(o for o in load_objects([CLUSTER]) if o["kind"] == "Pod")
    running = copy.deepcopy(pod)
    running["metadata"]["name"], running["status"] = "fine", {"phase": "Running"}
    running["metadata"]["annotations"]["volcano.sh/bind-phase"] = "success"  # left allocating: kept
    failed = copy.deepcopy(pod)
    failed["metadata"]["name"] = "broken"
    failed["status"] = {"phase": "Failed", "reason": "UnexpectedAdmissionError"}
    (tmp_path / "pods.yaml").write_text(yaml.safe_dump_all([running, failed]))
    names = [o["metadata"]["name"] for o in load_objects([tmp_path], DoctorPrefilter())]
    assert names == ["broken"]
    names = [o["metadata"]["name"] for o in load_objects([tmp_path], DoctorPrefilter(pod="default/fine"))]
    assert names == ["fine", "broken"]


def test_parallel_parse_gives_the_same_objects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for i in range(4):
        (tmp_path / f"part-{i}.yaml").write_text(NODE_TEXT.replace("dev-app-2-150-master-1", f"node-{i}"))
    serial = load_objects([tmp_path], DoctorPrefilter())
    monkeypatch.setattr(manifests, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(manifests.os, "cpu_count", lambda: 4)  # the pool runs on a 1-CPU machine too
    assert load_objects([tmp_path], DoctorPrefilter()) == serial


@pytest.mark.parametrize("prefilter", [None, DoctorPrefilter()])
def test_errors_name_the_file(tmp_path: Path, prefilter):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Node\nmetadata: {name: [unclosed\n")
    with pytest.raises(ManifestError, match=r"bad.yaml.*not valid YAML"):
        load_objects([bad], prefilter)
    (tmp_path / "bad.yaml").write_text("- just\n- a list\n")
    with pytest.raises(ManifestError, match="expected a Kubernetes object"):
        load_objects([bad], prefilter)
    with pytest.raises(ManifestError, match="no such file"):
        load_objects([tmp_path / "missing"], prefilter)
