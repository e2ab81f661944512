"""The policies in examples/ are what users copy first: each must be accepted by the CRD schema
the API server enforces and by the operator's model, and must render against the fixture cluster
without an error-level problem."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml
from vgpu_operator.api import VGPUPolicy
from vgpu_operator.registry import load_observed_from_manifests
from vgpu_operator.validate import validate

from tests.charts import chart

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
CRD = yaml.safe_load((ROOT / "crds" / "vgpu.io_vgpupolicies.yaml").read_text())


def _cluster_docs() -> list[dict]:
    docs: list[dict] = []
    for path in sorted((ROOT / "tests" / "fixtures" / "cluster").glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_passes_the_crd_schema(path: Path) -> None:
    # Closed: the API server would prune a misspelt field silently, so the example must not have one.
    schema = chart.instance_schema(CRD)
    jsonschema.Draft202012Validator(schema).validate(yaml.safe_load(path.read_text()))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates_on_the_fixture_cluster(path: Path) -> None:
    policy = VGPUPolicy.from_object(yaml.safe_load(path.read_text()))
    observed = load_observed_from_manifests(_cluster_docs(), policy.spec)
    errors = [p for p in validate(policy, observed) if p.severity == "error"]
    assert errors == []


def test_adopting_the_shipped_upstream_install_changes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The README's adoption walk-through, exactly as printed there: import, then diff.
    from vgpuctl.main import main

    install = str(ROOT / "examples" / "adopt-upstream")
    assert main(["import", "-f", install]) == 0
    policy = tmp_path / "policy.yaml"
    policy.write_text(capsys.readouterr().out)
    assert main(["diff", "--policy", str(policy), "-f", install]) == 0
    assert capsys.readouterr().out == "vgpuctl diff: nothing to change\n"
