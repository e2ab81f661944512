"""Pure renderers: policy + observed cluster -> the desired state of each target object.

    result = render_all(policy, observed)
    for target in result.targets:         # device-config, node-config, scheduler conf,
        if target.error: ...              #   scheduler Deployment, device plugin DaemonSet
        elif target.changed: apply(target.patch())

One module per target (`device_config`, `node_config`, `scheduler_conf`, `scheduler_deployment`,
`device_plugin`); each is deterministic (same input, same bytes) and edits only what it owns. A
target whose input is unusable (malformed scheduler conf, missing container, unknown plugin
generation) gets `error` and no `desired`; the other targets render as usual.
"""

from __future__ import annotations

from dataclasses import dataclass

from vgpu_operator.api import VGPUPolicy, VGPUPolicySpec
from vgpu_operator.observed import Observed
from vgpu_operator.render.device_config import render_device_config_target
from vgpu_operator.render.device_plugin import render_device_plugin_target
from vgpu_operator.render.inputs import Problem, describe
from vgpu_operator.render.node_config import render_node_config_target
from vgpu_operator.render.scheduler_conf import render_scheduler_conf_target
from vgpu_operator.render.scheduler_deployment import render_scheduler_deployment_target
from vgpu_operator.render.target import TargetRender

__all__ = ["Problem", "RenderResult", "TargetRender", "render_all"]



@dataclass
class RenderResult:
    """Every target, in a fixed order: device-config, node-config, scheduler ConfigMap, scheduler
    Deployment, device plugin DaemonSet."""

    targets: list[TargetRender]

    @property
    def problems(self) -> list[Problem]:
        return [t.error for t in self.targets if t.error is not None]

    @property
    def changed(self) -> list[TargetRender]:
        return [t for t in self.targets if t.changed]

    def target(self, kind: str, name: str) -> TargetRender:
        return next(t for t in self.targets if t.kind == kind and t.name == name)


def spec_of(policy: VGPUPolicy | VGPUPolicySpec) -> VGPUPolicySpec:
    return policy.spec if isinstance(policy, VGPUPolicy) else policy


def running_hashes(policy: VGPUPolicy | VGPUPolicySpec) -> dict[str, str | None]:
    """Target ref -> the restart hash its pods run with, as the policy's status last recorded it
    (InSync: matched; Updated: written, pods rolling). A workload the operator adopted without a
    restart has no annotation, so this is how a later drift of its inputs (a hand edit the
    operator repairs) is told apart from a change the pods have not seen. None (state Error): the
    apply that should have rolled it failed, possibly after writing its inputs, so its pods run
    with something else than what the live inputs now say."""
    status = policy.status if isinstance(policy, VGPUPolicy) else None
    if status is None:
        return {}
    recorded: dict[str, str | None] = {}
    for t in status.targets:
        if t.kind in ("Deployment", "DaemonSet") and t.hash and t.state in ("InSync", "Updated", "Error"):
            recorded[describe(t.kind, t.namespace, t.name)] = None if t.state == "Error" else t.hash
    return recorded


def render_all(policy: VGPUPolicy | VGPUPolicySpec, observed: Observed) -> RenderResult:
    """Render every target. Pure: reads only its arguments (the policy's status included)."""
    spec = spec_of(policy)
    running = running_hashes(policy)
    return RenderResult([
        render_device_config_target(spec, observed),
        render_node_config_target(spec, observed),
        render_scheduler_conf_target(spec, observed),
        render_scheduler_deployment_target(spec, observed, running),
        render_device_plugin_target(spec, observed, running),
    ])
