"""The chart ships the CRD the operator generates: a symlink into crds/, not a copy that can
drift, and helm follows it when it renders and when it packages the chart. Beside it, kopf's
peering CRD; Artifact Hub lists both."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import yaml
from vgpu_operator import crd

from tests.charts import chart

LINK = chart.CHART / "crds" / "vgpu.io_vgpupolicies.yaml"


def test_chart_crd_is_a_symlink_to_the_generated_file() -> None:
    assert LINK.is_symlink()
    assert LINK.resolve() == chart.CRD_FILE.resolve() == crd.CRD_PATH.resolve()


def test_chart_crd_equals_what_the_operator_generates() -> None:
    assert LINK.read_text() == crd.render_crd()


def test_helm_renders_the_generated_crd(default_objects: list[dict[str, Any]]) -> None:
    rendered = [o for o in chart.of_kind(default_objects, "CustomResourceDefinition")
                if o["metadata"]["name"] == "vgpupolicies.vgpu.io"]
    assert rendered == [yaml.safe_load(crd.render_crd())]


def test_helm_package_carries_the_crd_content(tmp_path: Path) -> None:
    chart.run_helm("package", str(chart.CHART), "--destination", str(tmp_path))
    (archive,) = tmp_path.glob("vgpu-operator-*.tgz")
    with tarfile.open(archive) as tar:
        member = tar.getmember("vgpu-operator/crds/vgpu.io_vgpupolicies.yaml")
        assert member.isfile(), "the package must hold the file, not a dangling link"
        data = tar.extractfile(member)
        assert data is not None
        assert data.read().decode() == crd.render_crd()
        names = tar.getnames()
    assert not any("/hack/" in n or n.endswith(".py") for n in names)


def test_artifacthub_lists_every_crd_the_chart_ships() -> None:
    meta = yaml.safe_load((chart.CHART / "Chart.yaml").read_text())
    listed = yaml.safe_load(meta["annotations"]["artifacthub.io/crds"])
    shipped = [yaml.safe_load(path.read_text()) for path in sorted((chart.CHART / "crds").glob("*.yaml"))]
    assert sorted((c["kind"], c["version"], c["name"]) for c in listed) == sorted(
        (crd_["spec"]["names"]["kind"], crd_["spec"]["versions"][0]["name"], crd_["metadata"]["name"])
        for crd_ in shipped)
