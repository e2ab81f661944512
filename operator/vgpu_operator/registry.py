"""The target registry: every object a policy renders, and what the rest of the operator needs
to know about it. Plan, reconcile, watches, release and status are driven from this table; none of
them names a target.

    for target in TARGETS:
        target.slot       # its `Observed` attribute, and its name in code
        target.kind       # the Kubernetes kind
        target.locate     # spec -> (namespace, name): where the policy says it lives
        target.render     # ClusterView -> TargetRender (pure: `vgpu_operator.render.<module>`)
        target.owned      # True: the operator creates it when missing and labels it as managed;
                          # False: someone else's object it edits in place, never creates
        target.restart    # what writing it restarts (None: nothing)

Adding a target: a renderer module, a row here, the `Observed` slot, the spec field that locates it
(`api.py`, then `make crds`), and its named RBAC rule in the chart (ARCHITECTURE.md, "Adding a target").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from vgpu_formats import device_config as dc_fmt

from vgpu_operator.api import VGPUPolicySpec
from vgpu_operator.observed import Observed, flatten, object_key
from vgpu_operator.render import (
    device_config,
    device_plugin,
    node_config,
    scheduler_conf,
    scheduler_deployment,
)
from vgpu_operator.render.inputs import Problem
from vgpu_operator.render.target import TargetRender

if TYPE_CHECKING:
    from vgpu_operator.view import ClusterView

Key = tuple[str, str, str]  # kind, namespace, name
RestartKind = Literal["scheduler", "daemonset", "plugin-pod"]


@dataclass(frozen=True)
class Rollout:
    """Writing the target's pod-template `annotation` rolls its pods (a `kind` restart)."""

    kind: RestartKind
    annotation: str


@dataclass(frozen=True)
class PluginPods:
    """A change of a node's entry restarts that node's device plugin pod: plugins read the target
    once, at start (the builtin plugin watches it, so it needs none)."""

    kind: RestartKind = "plugin-pod"


@dataclass(frozen=True)
class TargetType:
    slot: str
    kind: str
    locate: Callable[[VGPUPolicySpec], tuple[str, str]]
    render: Callable[[ClusterView], TargetRender]
    owned: bool
    restart: Rollout | PluginPods | None = None

    def key(self, spec: VGPUPolicySpec) -> Key:
        return (self.kind, *self.locate(spec))


@dataclass(frozen=True)
class InputType:
    """An object a policy reads but never writes. `optional`: read when the RBAC allows; a 403
    leaves it unknown, not an error."""

    slot: str
    kind: str
    locate: Callable[[VGPUPolicySpec], tuple[str, str] | None]  # None: not read for this spec
    optional: bool = False

    def key(self, spec: VGPUPolicySpec) -> Key | None:
        where = self.locate(spec)
        return None if where is None else (self.kind, *where)


# In this order: status lists targets so, and a reconcile writes them so (ConfigMaps before the
# workloads whose rollout reads them).
TARGETS: tuple[TargetType, ...] = (
    TargetType("device_config", "ConfigMap",
               lambda s: (s.targets.device_config.namespace, s.targets.device_config.name),
               device_config.render_device_config_target, owned=True),
    TargetType("node_config", "ConfigMap",
               lambda s: (s.targets.node_config.namespace, s.targets.node_config.name),
               node_config.render_node_config_target, owned=True, restart=PluginPods()),
    TargetType("scheduler_configmap", "ConfigMap",
               lambda s: (s.scheduler.namespace, s.scheduler.config_map),
               scheduler_conf.render_scheduler_conf_target, owned=False),
    TargetType("scheduler_deployment", "Deployment",
               lambda s: (s.scheduler.namespace, s.scheduler.deployment),
               scheduler_deployment.render_scheduler_deployment_target, owned=False,
               restart=Rollout("scheduler", scheduler_deployment.ANNOTATION)),
    TargetType("device_plugin", "DaemonSet",
               lambda s: (s.device_plugin.namespace, s.device_plugin.daemon_set),
               device_plugin.render_device_plugin_target, owned=False,
               restart=Rollout("daemonset", device_plugin.ANNOTATION)),
)


def _shadow(spec: VGPUPolicySpec) -> tuple[str, str] | None:
    # An upstream plugin reads kube-system's device-config first, so a leftover copy there shadows
    # a target in volcano-system.
    first = dc_fmt.PLUGIN_NAMESPACES[0]
    if spec.targets.device_config.namespace in dc_fmt.PLUGIN_NAMESPACES[1:]:
        return first, dc_fmt.CONFIGMAP_NAME
    return None


INPUTS: tuple[InputType, ...] = (
    InputType("device_config_shadow", "ConfigMap", _shadow, optional=True),
)

BY_SLOT: dict[str, TargetType] = {target.slot: target for target in TARGETS}
ROLLOUTS: dict[str, Rollout] = {t.kind: t.restart for t in TARGETS if isinstance(t.restart, Rollout)}


@dataclass(frozen=True)
class Wanted:
    """One object a policy names: the `Observed` slot it fills and whether a 403 is tolerated."""

    slot: str
    key: Key
    optional: bool = False


def wanted_objects(spec: VGPUPolicySpec) -> list[Wanted]:
    """Every object a policy renders or reads, for reads, watches and manifests."""
    wanted = [Wanted(t.slot, t.key(spec)) for t in TARGETS]
    for input_ in INPUTS:
        key = input_.key(spec)
        if key is not None:
            wanted.append(Wanted(input_.slot, key, input_.optional))
    return wanted


@dataclass
class RenderResult:
    """Every target, in registry order."""

    targets: list[TargetRender]

    @property
    def problems(self) -> list[Problem]:
        return [t.error for t in self.targets if t.error is not None]

    @property
    def changed(self) -> list[TargetRender]:
        return [t for t in self.targets if t.changed]

    def target(self, kind: str, name: str) -> TargetRender:
        return next(t for t in self.targets if t.kind == kind and t.name == name)

    def of(self, slot: str) -> TargetRender | None:
        return next((t for t in self.targets if t.slot == slot), None)


def render_targets(view: ClusterView) -> RenderResult:
    """Render every target. Pure: reads only the view (the stored status included)."""
    rendered = []
    for target in TARGETS:
        result = target.render(view)
        result.slot = target.slot
        rendered.append(result)
    return RenderResult(rendered)


def load_observed_from_manifests(docs: Iterable[dict[str, Any] | None], spec: VGPUPolicySpec) -> Observed:
    """Pick the policy's objects out of manifests (`kind: List` items included); a later
    document with the same kind/namespace/name wins, as `kubectl apply` of the files in order."""
    by_key: dict[Key, dict[str, Any]] = {}
    nodes: dict[str, dict[str, Any]] = {}
    for doc in flatten(docs):
        key = object_key(doc)
        if key[0] == "Node":
            nodes[key[2]] = doc
        else:
            by_key[key] = doc
    observed = Observed(nodes=list(nodes.values()))
    for wanted in wanted_objects(spec):
        setattr(observed, wanted.slot, by_key.get(wanted.key))
    return observed
