"""Render the device-config ConfigMap (`device-config.yaml`) from the policy.

We own the known keys of the `nvidia:` section. Other top-level sections (`vnpus` for Ascend),
keys inside `nvidia:` that upstream does not know, other data keys, labels and annotations are
kept as they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml
from vgpu_formats import device_config as fmt
from vgpu_formats import device_fields, yamlio
from vgpu_formats.errors import FormatError
from vgpu_formats.rewrite import rewrite

from vgpu_operator import versions
from vgpu_operator.render.inputs import InputError, Problem, describe, short_hash
from vgpu_operator.render.target import TargetRender, configmap_target, failed_target

if TYPE_CHECKING:
    from vgpu_operator.observed import Observed
    from vgpu_operator.view import ClusterView


def _geometry(models: list[str], *groups: tuple[str, list[tuple[str, int, int]]]) -> dict[str, Any]:
    return {"models": models, "allowedGeometries": [
        {"group": group, "geometries": [{"name": n, "memory": m, "count": c} for n, m, c in shapes]}
        for group, shapes in groups]}


# The tables volcano-vgpu-device-plugin ships (volcano-vgpu-device-plugin.yml), kept exactly (the
# repeated A100-SXM4-40GB included) so adopting a stock install changes nothing. v1.12.0 fixed the
# A100-80GB shapes (operator/README.md, "Plugin generations"); `versions.PluginTraits.mig_table`
# says which table a generation gets.
_A30 = _geometry(["A30"], ("group1", [("1g.6gb", 6144, 4)]), ("group2", [("2g.12gb", 12288, 2)]),
                 ("group3", [("4g.24gb", 24576, 1)]))
_A100_40GB = _geometry(["A100-SXM4-40GB", "A100-40GB-PCIe", "A100-PCIE-40GB", "A100-SXM4-40GB"],
                       ("group1", [("1g.5gb", 5120, 7)]),
                       ("group2", [("2g.10gb", 10240, 3), ("1g.5gb", 5120, 1)]),
                       ("group3", [("3g.20gb", 20480, 2)]), ("group4", [("7g.40gb", 40960, 1)]))
_A100_80GB_MODELS = ["A100-SXM4-80GB", "A100-80GB-PCIe", "A100-PCIE-80GB"]
UPSTREAM_MIG_GEOMETRIES: dict[versions.MigTable, list[dict[str, Any]]] = {
    "v1.11": [_A30, _A100_40GB, _geometry(
        _A100_80GB_MODELS, ("group1", [("1g.10gb", 10240, 7)]),
        ("group2", [("2g.20gb", 20480, 3), ("1g.10gb", 10240, 1)]),
        ("group3", [("3g.40gb", 40960, 2)]), ("group4", [("7g.79gb", 80896, 1)]))],
    "v1.12": [_A30, _A100_40GB, _geometry(
        _A100_80GB_MODELS, ("group1", [("1g.10gb", 9728, 7)]),
        ("group2", [("2g.20gb", 19968, 3), ("1g.10gb", 9728, 1)]),
        ("group3", [("3g.40gb", 40192, 2)]), ("group4", [("7g.80gb", 80896, 1)]))],
}

# Every upstream key the policy can set; `passDeviceSpecs` (unused upstream) stays whatever it is.
OWNED_KEYS = frozenset(field.alias or name for name, field in fmt.NvidiaConfig.model_fields.items()) - {
    "passDeviceSpecs"}


def desired_nvidia(view: ClusterView) -> fmt.NvidiaConfig:
    """The `nvidia:` section the policy asks for, every owned field explicit; unset
    knownMigGeometries: the table the target plugin generation ships."""
    device, names = view.spec.device, view.spec.resources
    if device.known_mig_geometries is None:
        table = versions.plugin_traits(view.generation).mig_table
        geometries = UPSTREAM_MIG_GEOMETRIES[table]
    else:
        geometries = [g.model_dump(by_alias=True) for g in device.known_mig_geometries]
    # Which policy field is which key: vgpu_formats.device_fields, the one table.
    spec_data = {"resources": names.model_dump(by_alias=True),
                 "device": device.model_dump(by_alias=True, exclude={"known_mig_geometries"})}
    return fmt.NvidiaConfig.model_validate({**device_fields.to_nvidia(spec_data),
                                            "knownMigGeometries": geometries}, by_alias=True, by_name=False)


# What Volcano's scheduler uses from the section (docs/upstream.md §2.2); the rest is plugin-only.
SCHEDULER_KEYS = ("resourceCountName", "resourceMemoryName", "resourceMemoryPercentageName",
                  "resourceCoreName", "gpuMemoryFactor", "knownMigGeometries")


def owned_section(view: ClusterView) -> dict[str, Any]:
    """Our part of `nvidia:` as plain data (the restart hashes cover it)."""
    return desired_nvidia(view).to_yaml_dict()


def plugin_reads(generation: versions.Generation | None, cfg: fmt.DeviceConfig | None) -> dict[str, Any]:
    """Our keys as a plugin of `generation` reads them: equal values mean a plugin started on one
    config behaves as if started on the other."""
    view = versions.plugin_config_view(generation, cfg).to_yaml_dict()
    return {k: v for k, v in view.items() if k in OWNED_KEYS}


def scheduler_reads(cfg: fmt.DeviceConfig | None) -> dict[str, Any]:
    """The keys the scheduler uses, as it reads them (Go zero values for absent keys)."""
    view = fmt.scheduler_view(cfg).to_yaml_dict()
    return {key: view.get(key) for key in SCHEDULER_KEYS}


def desired_config(view: ClusterView) -> fmt.DeviceConfig:
    return fmt.DeviceConfig(nvidia=desired_nvidia(view))


def live_document(observed: Observed, where: str) -> dict[str, Any] | None:
    """The live `device-config.yaml` as data; None when the ConfigMap or key is missing.
    Raises InputError when the text is not a YAML mapping (we would lose what it holds)."""
    text = observed.device_config_text()
    if text is None:
        return None
    why = "is not a YAML mapping with an `nvidia:` mapping"
    try:
        doc = yamlio.load(text)
    except yaml.YAMLError as exc:
        doc, why = text, f"cannot be read ({yamlio.describe(exc)})"  # reported below
    if doc is None:
        return {}
    if not isinstance(doc, dict) or not isinstance(doc.get("nvidia") or {}, dict):
        raise InputError(Problem(
            "spec.targets.deviceConfig", "DeviceConfigUnreadable",
            f"{where} key {fmt.CONFIGMAP_KEY} {why}, so the "
            "scheduler uses built-in defaults. The operator does not overwrite it blindly (it may hold "
            f"other sections): fix the YAML or delete the key {fmt.CONFIGMAP_KEY}", object=where))
    return {str(k): v for k, v in doc.items()}


def _still_unreadable(text: str) -> FormatError | None:
    """Why `text`, the operator's settings merged into the live file, fails its readers' strict
    load: a setting the operator does not own with a value of the wrong type (say
    `passDeviceSpecs: "true"`). Written anyway, it would be written again at every resync, the
    readers never loading it."""
    try:
        fmt.parse_device_config(text)
    except FormatError as err:
        return err
    return None


def render_device_config_target(view: ClusterView) -> TargetRender:
    ref = view.spec.targets.device_config
    where = describe("ConfigMap", ref.namespace, ref.name)
    ours = desired_nvidia(view)
    try:
        live_doc = live_document(view, where)
    except InputError as err:
        return failed_target("ConfigMap", ref.namespace, ref.name, view.device_config, err.problem)
    live_doc = live_doc or {}
    live_section = live_doc.get("nvidia") or {}
    foreign = {k: v for k, v in live_section.items() if k not in OWNED_KEYS}
    nvidia = ours.model_copy()
    nvidia.__pydantic_extra__ = foreign
    cfg = fmt.DeviceConfig(nvidia=nvidia, others={k: v for k, v in live_doc.items() if k != "nvidia"})
    # Same meaning: keep the live bytes (adopting a hand-written ConfigMap rewrites nothing).
    live_text = view.device_config_text()
    text = None
    if live_text is None or not fmt.same_meaning(view.live_device_config, cfg):
        # An edited ConfigMap keeps its comments and layout; a new one gets upstream's key order.
        text = rewrite(live_text, fmt.device_config_dict(cfg), fmt.render_device_config_dict) \
            if live_text else fmt.render_device_config(cfg)
        unreadable = _still_unreadable(text)
        if unreadable is not None:
            return failed_target("ConfigMap", ref.namespace, ref.name, view.device_config, Problem(
                "spec.targets.deviceConfig", "DeviceConfigUnreadable",
                f"{where} key {fmt.CONFIGMAP_KEY}: {unreadable.field}: {unreadable.problem}. The "
                "operator does not own that setting and keeps it as written, so writing its own "
                f"would not make the file readable ({unreadable.fix}): fix or remove it",
                object=where))
    return configmap_target(ref.namespace, ref.name, fmt.CONFIGMAP_KEY, view.device_config, text,
                            short_hash(ours.to_yaml_dict()))
