"""`decide` on one `ClusterView`: each input parsed once however many renderers and rules read it."""

from __future__ import annotations

from typing import Any

import pytest
from vgpu_formats import device_config as dc_fmt
from vgpu_operator import view as view_module
from vgpu_operator.api import VGPUPolicy
from vgpu_operator.decide import decide
from vgpu_operator.registry import load_observed_from_manifests
from vgpu_operator.view import ClusterView, view_of


def _policy(status: dict[str, Any] | None = None) -> VGPUPolicy:
    body: dict[str, Any] = {"apiVersion": "vgpu.io/v1alpha1", "kind": "VGPUPolicy",
                            "metadata": {"name": "default", "generation": 1},
                            "spec": {"device": {"deviceSplitCount": 4}}}
    if status is not None:
        body["status"] = status
    return VGPUPolicy.from_object(body)


def test_a_reconcile_parses_each_input_once(cluster_docs: list[dict[str, Any]],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"scheduler": 0, "device-config": 0}
    parse_conf, load_config = view_module.parse_scheduler_conf, dc_fmt.load_device_config

    def counted_conf(*args: Any) -> Any:
        calls["scheduler"] += 1
        return parse_conf(*args)

    def counted_config(text: str | None) -> Any:
        calls["device-config"] += 1
        return load_config(text)

    monkeypatch.setattr(view_module, "parse_scheduler_conf", counted_conf)
    monkeypatch.setattr(view_module.dc_fmt, "load_device_config", counted_config)
    policy = _policy({"targets": [{"kind": "ConfigMap", "namespace": "kube-system",
                                   "name": "volcano-vgpu-device-config", "hash": "x", "state": "InSync"}]})
    view = ClusterView.of(load_observed_from_manifests(cluster_docs, policy.spec), policy.spec, policy.status)
    decision = decide(policy, view)
    assert decision.render is not None and len(decision.render.targets) == 5
    assert calls == {"scheduler": 1, "device-config": 1}, "every renderer and rule reads the view's parse"
    assert view_of(view, policy) is view, "validate reuses the view it is given"

