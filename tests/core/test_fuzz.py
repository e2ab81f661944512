"""Garbage in the observed objects never raises: render_all and validate report, they do not crash."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vgpu_operator.api import parse_spec
from vgpu_operator.decide import render_all
from vgpu_operator.validate import validate

from tests.core.conftest import FIXTURES, load_docs
from tests.core.support import observe

BASE = load_docs(*sorted((FIXTURES / "cluster").glob("*.yaml")))

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20)),
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.dictionaries(st.text(max_size=8), children, max_size=3)),
    max_leaves=8,
)
yaml_like_text = st.one_of(st.text(max_size=60), st.sampled_from([
    "tiers: 3", "tiers:\n- 1\n- plugins: 2",
    "tiers:\n- plugins:\n  - 5\n  - name: deviceshare\n    arguments: [1]",
    "nvidia: 3", "nvidia:\n  knownMigGeometries: {}", "{", "[1, 2]", "nodeconfig: 1", '{"nodeconfig": [1]}',
]))

# (path into the object list, replacement strategy)
DS = ("DaemonSet", "volcano-device-plugin", "spec", "template")
SPOTS = [
    (("ConfigMap", "volcano-scheduler-configmap", "data", "volcano-scheduler.conf"), yaml_like_text),
    (("ConfigMap", "volcano-vgpu-device-config", "data", "device-config.yaml"), yaml_like_text),
    (("ConfigMap", "volcano-vgpu-node-config", "data", "config.json"), yaml_like_text),
    ((*DS, "spec", "containers", 0, "args"), json_values),
    ((*DS, "spec", "containers", 0, "image"), json_values),
    ((*DS, "metadata"), json_values),
    (("Deployment", "volcano-scheduler", "spec", "template", "spec", "containers"), json_values),
    (("Node", "dev-app-2-150-master-1", "metadata", "annotations", "volcano.sh/node-vgpu-register"),
     st.text(alphabet="GPU-0123,:abtrue", max_size=60)),
    (("Node", "dev-app-2-150-master-1", "metadata", "labels"), json_values),
]


def _put(docs: list[dict[str, Any]], path: tuple[Any, ...], value: Any) -> None:
    kind, name, *keys = path
    node: Any = next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value


@st.composite
def damaged(draw: st.DrawFn) -> list[dict[str, Any]]:
    docs = copy.deepcopy(BASE)
    spots = st.lists(st.sampled_from(SPOTS), min_size=1, max_size=3, unique_by=lambda s: s[0])
    for path, values in draw(spots):
        _put(docs, path, draw(values))
    return docs


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=damaged())
def test_garbage_is_reported_not_raised(docs: list[dict[str, Any]]) -> None:
    override = {"nodeSelector": {"matchLabels": {"gpu": "on"}}, "deviceSplitCount": 2}
    spec = parse_spec({"nodeOverrides": [override]})
    observed = observe(docs, spec)
    result = render_all(spec, observed)
    problems = validate(spec, observed)
    for target in result.targets:
        assert (target.desired is None) == (target.error is not None)
        target.patch()
    assert all(p.message for p in problems)
