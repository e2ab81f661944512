"""The selector index gives exactly Kubernetes label-selector semantics (checked against a plain
node-by-node matcher on random nodes and selectors)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from vgpu_operator.api import LabelSelector, LabelSelectorRequirement
from vgpu_operator.render.selectors import LabelIndex

KEYS = ["pool", "zone", "gpu"]
VALUES = ["a", "b", "c"]


def _plain_match(selector: LabelSelector, labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.match_labels.items()):
        return False
    for req in selector.match_expressions:
        ok = {"In": lambda r: labels.get(r.key) in r.values,
              "NotIn": lambda r: labels.get(r.key) not in r.values,
              "Exists": lambda r: r.key in labels,
              "DoesNotExist": lambda r: r.key not in labels}[req.operator](req)
        if not ok:
            return False
    return True


labels = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=3)
some_labels = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2)
requirement = st.one_of(
    st.builds(LabelSelectorRequirement, key=st.sampled_from(KEYS), operator=st.sampled_from(["In", "NotIn"]),
              values=st.lists(st.sampled_from(VALUES), min_size=1, max_size=2)),
    st.builds(LabelSelectorRequirement, key=st.sampled_from(KEYS),
              operator=st.sampled_from(["Exists", "DoesNotExist"])),
)
selectors = st.builds(LabelSelector,
                      match_labels=some_labels,
                      match_expressions=st.lists(requirement, max_size=3))


@settings(max_examples=150, deadline=None)
@given(node_labels=st.lists(labels, max_size=12), selector=selectors)
def test_index_matches_like_kubernetes(node_labels: list[dict[str, str]], selector: LabelSelector) -> None:
    nodes: list[dict[str, Any]] = [{"metadata": {"name": f"n{i}", "labels": lab}}
                                   for i, lab in enumerate(node_labels)]
    index = LabelIndex(nodes, set(KEYS))
    expected = {f"n{i}" for i, lab in enumerate(node_labels) if _plain_match(selector, lab)}
    assert index.select(selector) == expected
