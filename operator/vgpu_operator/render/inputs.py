"""Reading the observed objects a renderer edits, and the `Problem` both validation and rendering
report when an input cannot be used (it names the policy field, the object and the fix)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import yaml
from vgpu_formats import yamlio

Severity = Literal["error", "warning"]
DEVICESHARE = "deviceshare"  # the Volcano plugin that carries vGPU scheduling


@dataclass(frozen=True)
class Problem:
    """Something wrong with the policy or the cluster it applies to.

    `field`: a path in the policy (`spec.resources.count`); `reason`: CamelCase, for conditions
    and events; `message`: what is wrong AND the fix; `severity`: errors block writes, warnings
    are reported; `object`: the cluster object concerned (`ConfigMap ns/name`), if any.
    """

    field: str
    reason: str
    message: str
    severity: Severity = "error"
    object: str = ""

    def __str__(self) -> str:
        where = f" [{self.object}]" if self.object else ""
        return f"{self.severity}: {self.field}{where}: {self.reason}: {self.message}"


def describe(kind: str, namespace: str, name: str) -> str:
    """`ConfigMap kube-system/volcano-vgpu-device-config`."""
    return f"{kind} {namespace}/{name}"


def short_hash(data: Any) -> str:
    """16 hex digits of sha256 over canonical JSON (or the text itself)."""
    raw = data if isinstance(data, str) else json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


class InputError(Exception):
    """An observed object the renderers cannot work with; carries the Problem to report."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(str(problem))
        self.problem = problem


def parse_scheduler_conf(text: str | None, where: str, key: str) -> dict[str, Any]:
    """The scheduler conf as data. Raises InputError when missing, not YAML, not a mapping, or
    without a `tiers` list (the scheduler would fall back to its built-in conf)."""
    if text is None:
        raise InputError(Problem("spec.scheduler.key", "SchedulerConfMissing",
                                 f"{where} has no key {key!r}; set spec.scheduler.key to the key that "
                                 "holds volcano-scheduler.conf", object=where))
    try:
        conf = yamlio.load(text)
    except yaml.YAMLError as exc:
        raise InputError(Problem("spec.scheduler.configMap", "SchedulerConfInvalid",
                                 f"{where} key {key}: {yamlio.describe(exc)}; the scheduler keeps its "
                                 "previous conf. Fix the YAML, then the operator adds deviceshare",
                                 object=where)) from exc
    if not isinstance(conf, dict) or not isinstance(conf.get("tiers"), list):
        raise InputError(Problem("spec.scheduler.configMap", "SchedulerConfNoTiers",
                                 f"{where} key {key} has no `tiers:` list; the scheduler would ignore it. "
                                 "Restore the tiers (see Volcano's default conf), then the operator adds "
                                 "deviceshare", object=where))
    duplicated = duplicated_plugin(conf, DEVICESHARE)
    if duplicated:
        raise InputError(Problem("spec.scheduler.configMap", "DeviceShareDuplicated",
                                 f"{where} key {key}: {duplicated}", object=where))
    return conf


def placed_plugins(conf: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every plugin option of every tier with where it is (`tiers[1].plugins[0]`), in order;
    malformed tiers and entries skipped."""
    found: list[tuple[str, dict[str, Any]]] = []
    tiers = conf.get("tiers")
    for t, tier in enumerate(tiers if isinstance(tiers, list) else []):
        plugins = tier.get("plugins") if isinstance(tier, dict) else None
        if isinstance(plugins, list):
            found += [(f"tiers[{t}].plugins[{p}]", plugin) for p, plugin in enumerate(plugins)
                      if isinstance(plugin, dict)]
    return found


def tier_plugins(conf: dict[str, Any]) -> list[dict[str, Any]]:
    """Every plugin option of every tier, in order (malformed entries skipped)."""
    return [plugin for _, plugin in placed_plugins(conf)]


def find_plugin(conf: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The plugin option named `name`; the last one when several are (Volcano builds each and the
    last one's arguments win)."""
    return next((p for p in reversed(tier_plugins(conf)) if p.get("name") == name), None)


def duplicated_plugin(conf: dict[str, Any], name: str) -> str:
    """Why `name` listed more than once is unusable, with the fix; "" when it is listed at most once.
    Which entry an editor should change is a guess (the operator once edited the first, Volcano
    read the last), so the person who wrote both decides."""
    places = [place for place, plugin in placed_plugins(conf) if plugin.get("name") == name]
    if len(places) < 2:
        return ""
    return (f"{name} is listed {len(places)} times ({', '.join(places)}); Volcano applies only the last "
            f"one's arguments. Keep one {name} entry, then the operator sets its arguments")


def check_workload(workload: dict[str, Any], where: str, field: str) -> None:
    """Raise InputError unless the pod template has the shape the API server guarantees (a
    hand-made manifest may not): dict metadata and annotations, a list of dict containers whose
    command and args are strings."""
    spec = workload.get("spec")
    template = spec.get("template") if isinstance(spec, dict) else None
    problem = ""
    if not isinstance(template, dict):
        problem = "spec.template is not an object"
    elif not isinstance(template.get("metadata") or {}, dict) or \
            not isinstance((template.get("metadata") or {}).get("annotations") or {}, dict):
        problem = "spec.template.metadata.annotations is not a map"
    elif not isinstance(template.get("spec"), dict) or \
            not isinstance(template["spec"].get("containers"), list):
        problem = "spec.template.spec.containers is not a list"
    else:
        for index, container in enumerate(template["spec"]["containers"]):
            argv = [container.get(key) or [] for key in ("command", "args")] \
                if isinstance(container, dict) else [None]
            if not all(isinstance(part, list) and all(isinstance(a, str) for a in part) for part in argv):
                problem = f"spec.template.spec.containers[{index}] is not a container with string args"
                break
    if problem:
        raise InputError(Problem(field, "WorkloadMalformed",
                                 f"{where}: {problem}; fix the object (kubectl edit)", object=where))


def pod_template(workload: dict[str, Any]) -> dict[str, Any]:
    return dict((workload.get("spec") or {}).get("template") or {})


def containers_of(workload: dict[str, Any]) -> list[dict[str, Any]]:
    return list((pod_template(workload).get("spec") or {}).get("containers") or [])


def find_container(workload: dict[str, Any], name: str, where: str) -> tuple[int, dict[str, Any]]:
    """(index, container) named `name`. Raises InputError listing the names that exist."""
    containers = containers_of(workload)
    for index, container in enumerate(containers):
        if container.get("name") == name:
            return index, container
    names = ", ".join(str(c.get("name")) for c in containers) or "none"
    raise InputError(Problem("spec.devicePlugin.container", "DevicePluginContainerNotFound",
                             f"{where} has no container named {name!r} (containers: {names}); set "
                             "spec.devicePlugin.container to the plugin's container", object=where))


def template_annotations(workload: dict[str, Any] | None) -> dict[str, str]:
    if workload is None:
        return {}
    return dict((pod_template(workload).get("metadata") or {}).get("annotations") or {})


def updated_on_delete(daemonset: Mapping[str, Any] | None) -> bool:
    """Whether the DaemonSet's pods take a new template only when deleted (updateStrategy
    OnDelete): a rollout by template annotation then restarts nothing."""
    strategy = ((daemonset or {}).get("spec") or {}).get("updateStrategy") or {}
    return isinstance(strategy, dict) and strategy.get("type") == "OnDelete"
