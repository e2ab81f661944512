"""Render the device plugin DaemonSet: args right for its generation, and a config hash.

* legacy (<= v1.11): sizing and resource names come from flags only, so `LEGACY_FLAGS` are set to
  the policy's values (replaced in place, `--flag=value` or `--flag value` form kept; missing ones
  appended as `--flag=value`).
* current (v1.12+): `--resource-*` flags make it exit and explicit sizing flags override the
  ConfigMap, so all of `LEGACY_FLAGS` are removed; sizing comes from device-config. Every other
  flag the v1.12 binary does not define (`versions.CURRENT_FLAGS`) is removed too: it would exit 1
  on it (`-v=4`, `--node-name`, `--debug` from a v1.11 DaemonSet); validation names each one.
* builtin (ours): the same removal of `LEGACY_FLAGS`; our plugin watches the ConfigMaps itself.
  Where it reads them (`--device-config-*`, `--node-config-*`) is set to the policy's targets, so it
  reads exactly what the scheduler reads; a flag that would only repeat the plugin's own default
  is not added.

The binary gets `command` + `args`: flags written in `command` after the binary (`command[0]`, or
the token after `--` of a wrapper such as `tini -- plugin`) are edited the same way. A shell's
script is not ours to edit: nothing is changed or appended (the args would become the script's
`$0`...), and validation reports it. A value flag written `--flag value` takes the next token with
it unless that is a flag; a negative number is a value (`--device-split-count -4`). A v1.12 switch
written with a separate value (`--fail-on-init-error false`) loses the value: Go's flag parsing
stops at it and ignores every later flag. Every other arg keeps its value and order.
`vgpu.io/plugin-config-hash` on the pod template covers what the plugin reads only at start (args,
plus device-config content for legacy/current; builtin watches the ConfigMap). Env, volumes, other
containers and other annotations are untouched.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vgpu_formats import device_config as dc_fmt
from vgpu_formats import node_config as nc_fmt

from vgpu_operator.api import VGPUPolicySpec
from vgpu_operator.render import device_config
from vgpu_operator.render.inputs import (
    InputError,
    Problem,
    check_workload,
    describe,
    find_container,
    short_hash,
)
from vgpu_operator.render.target import TargetRender, failed_target, missing_target, workload_target
from vgpu_operator.versions import (
    LEGACY_FLAG_DEFAULTS,
    LEGACY_SWITCHES,
    Generation,
    plugin_traits,
)

if TYPE_CHECKING:
    from vgpu_operator.view import ClusterView

ANNOTATION = "vgpu.io/plugin-config-hash"
LEGACY_DEFAULTS = LEGACY_FLAG_DEFAULTS
LEGACY_FLAGS = tuple(LEGACY_DEFAULTS)  # v1.11's name and sizing flags
# A plugin binary that is one of these runs a script: its flags are not ours to edit.
SHELLS = frozenset({"sh", "bash", "ash", "dash", "zsh", "busybox"})
_NEGATIVE_NUMBER = re.compile(r"-\d+(\.\d+)?")
# What Go's strconv.ParseBool takes: the separate value someone meant for a switch.
_GO_BOOLS = frozenset({"1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False"})


def builtin_defaults(spec: VGPUPolicySpec) -> dict[str, str]:
    """What our plugin reads without a location flag. Without --device-config-namespace it tries
    kube-system first; without --node-config-namespace it looks where device-config was found."""
    return {"device-config-name": dc_fmt.CONFIGMAP_NAME,
            "device-config-namespace": dc_fmt.PLUGIN_NAMESPACES[0],
            "node-config-name": nc_fmt.CONFIGMAP_NAME,
            "node-config-namespace": spec.targets.device_config.namespace}


def _number(value: float) -> str:
    return f"{value:g}"


def desired_flags(spec: VGPUPolicySpec, generation: Generation) -> dict[str, str | None]:
    """flag name (no dashes) -> value; None removes the flag."""
    if generation == "builtin":
        targets = spec.targets
        return {**dict.fromkeys(LEGACY_FLAGS),
                "device-config-name": targets.device_config.name,
                "device-config-namespace": targets.device_config.namespace,
                "node-config-name": targets.node_config.name,
                "node-config-namespace": targets.node_config.namespace}
    if generation != "legacy":
        return dict.fromkeys(LEGACY_FLAGS)
    return {
        "resource-name": spec.resources.count,
        "resource-memory-name": spec.resources.memory,
        "resource-core-name": spec.resources.cores,
        "device-split-count": str(spec.device.device_split_count),
        "gpu-memory-factor": str(spec.device.gpu_memory_factor),
        "device-cores-scaling": _number(spec.device.device_core_scaling),
    }


@dataclass(frozen=True)
class EditedArgv:
    """A container's `command` and `args` after the edit; the flags removed because the binary
    does not define them (each as written, with its separate value if it had one); the switches
    whose separate value was removed (`--fail-on-init-error false`); and whether a shell runs the
    plugin (then nothing was edited)."""

    command: list[str]
    args: list[str]
    dropped: list[str]
    stray_values: list[str]
    shell: bool = False


def _split_command(command: list[str]) -> tuple[list[str], list[str]] | None:
    """(the launcher up to and with the binary, the flags after it); None when the binary is a
    shell. The binary is `command[0]`, or the token after `--` of a wrapper (`tini -- plugin`); a
    command ending in `--` leaves the binary to `args`."""
    end = command.index("--", 1) + 1 if "--" in command[1:] else 0
    binary = command[end] if end < len(command) else ""
    if binary and binary.rsplit("/", 1)[-1] in SHELLS:
        return None
    return command[:end + 1], command[end + 1:]


def command_flags(command: list[str]) -> list[str] | None:
    """The args written in `command` after the binary; None when a shell runs a script."""
    split = _split_command(command)
    return None if split is None else split[1]


def _flag_name(token: str) -> tuple[int, str, bool] | None:
    """(dashes, name, has `=value`) of a flag token; None for a positional, `-` or `--`."""
    dashes = len(token) - len(token.lstrip("-"))
    name, eq, _ = token[dashes:].partition("=")
    if dashes not in (1, 2) or not name or _NEGATIVE_NUMBER.fullmatch(token):
        return None
    return dashes, name, bool(eq)


def _value_at(tokens: list[str], index: int) -> bool:
    """Is there a separate value at `index` (a token that is not a flag)?"""
    return index < len(tokens) and tokens[index] != "--" and _flag_name(tokens[index]) is None


def _edit(tokens: list[str], flags: dict[str, str | None], accepted: Mapping[str, bool] | None,
          seen: set[str], dropped: list[str], stray: list[str]) -> list[tuple[int, str]]:
    """(source position, token) of `tokens` with `flags` set or removed and, when `accepted` is
    given, every flag it does not hold removed, and every separate value of a switch."""
    out: list[tuple[int, str]] = []
    index = 0
    while index < len(tokens):
        at, token = index, tokens[index]
        index += 1
        if token == "--":  # the rest is positional
            out += [(at + k, t) for k, t in enumerate(tokens[at:])]
            break
        parsed = _flag_name(token)
        if parsed is None:
            out.append((at, token))
            continue
        dashes, name, eq = parsed
        if name in flags:
            separate = not eq and _value_at(tokens, index)
            if separate:
                index += 1  # the value goes with its flag
            value = flags[name]
            if name in seen or value is None:
                continue
            seen.add(name)
            out += [(at, token), (at, value)] if separate else [(at, f"{token[:dashes]}{name}={value}")]
            continue
        if accepted is not None and name not in accepted:
            # A v1.11 switch takes no value; any other flag its separate value, if it has one.
            takes = not eq and name not in LEGACY_SWITCHES and _value_at(tokens, index)
            dropped.append(f"{token} {tokens[index]}" if takes else token)
            if takes:
                index += 1
            continue
        out.append((at, token))
        if accepted is None or eq or not _value_at(tokens, index):
            continue
        if accepted.get(name) is False:
            out.append((index, tokens[index]))  # a defined value flag's value, kept as written
            index += 1
        elif tokens[index] in _GO_BOOLS:  # a switch's value: Go stops parsing there
            stray.append(f"{token} {tokens[index]}")
            index += 1
    return out


def edit_argv(command: list[str], args: list[str], flags: dict[str, str | None],
              defaults: Mapping[str, str] | None = None,
              accepted: Mapping[str, bool] | None = None) -> EditedArgv:
    """`command` and `args` with `flags` set or removed and, when `accepted` is given, every flag
    not in it removed. Other args untouched, in order; a repeated flag of ours keeps its first
    position only; a missing one is appended to `args`, unless its value equals its entry in
    `defaults` (the binary already uses that value). A shell's command and args stay as they are."""
    split = _split_command(command)
    if split is None:
        return EditedArgv(list(command), list(args), [], [], shell=True)
    launcher, tail = split
    seen: set[str] = set()
    dropped: list[str] = []
    stray: list[str] = []
    edited = _edit([*tail, *args], flags, accepted, seen, dropped, stray)
    new_tail = [token for at, token in edited if at < len(tail)]
    new_args = [token for at, token in edited if at >= len(tail)]
    defaults = defaults or {}
    new_args += [f"--{name}={value}" for name, value in flags.items()
                 if value is not None and name not in seen and defaults.get(name) != value]
    return EditedArgv([*launcher, *new_tail], new_args, dropped, stray)


def flag_pairs(tokens: list[str]) -> list[tuple[str, str]]:
    """`--flag=value` and `--flag value` tokens as `("--flag", value)` in order (one or two dashes;
    a flag with no value gives "true")."""
    out: list[tuple[str, str]] = []
    index = 0
    while index < len(tokens):
        parsed = _flag_name(tokens[index])
        index += 1
        if parsed is None:
            continue
        _, name, eq = parsed
        value = tokens[index - 1].partition("=")[2] if eq else "true"
        if not eq and _value_at(tokens, index):
            value = tokens[index]
            index += 1
        out.append((f"--{name}", value))
    return out


def flag_values(tokens: list[str]) -> dict[str, str]:
    """`flag_pairs` as a dict: the last of a repeated flag wins, as in Go's flag parsing."""
    return dict(flag_pairs(tokens))


def edit_args(args: list[str], flags: dict[str, str | None],
              defaults: Mapping[str, str] | None = None) -> list[str]:
    """`edit_argv` of args alone, nothing but `flags` removed."""
    return edit_argv([], args, flags, defaults).args


def container_argv(container: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(command, args) of a container as strings (one that is not a list: empty)."""
    command, args = (container.get(key) for key in ("command", "args"))
    return ([str(a) for a in command] if isinstance(command, list) else [],
            [str(a) for a in args] if isinstance(args, list) else [])


def binary_args(container: Mapping[str, Any]) -> list[str]:
    """What the plugin binary parses: the flags in `command` after it, then `args` (none that a
    reader can see when a shell runs it)."""
    command, args = container_argv(container)
    head = command_flags(command)
    return [] if head is None else [*head, *args]


def edited_container_argv(spec: VGPUPolicySpec, container: Mapping[str, Any],
                          generation: Generation) -> EditedArgv:
    """The plugin container's command and args as the policy wants them for `generation`."""
    command, args = container_argv(container)
    defaults = builtin_defaults(spec) if generation == "builtin" else LEGACY_DEFAULTS
    return edit_argv(command, args, desired_flags(spec, generation), defaults,
                     plugin_traits(generation).flags)


def render_device_plugin_target(view: ClusterView) -> TargetRender:
    spec = view.spec
    plugin = spec.device_plugin
    where = describe("DaemonSet", plugin.namespace, plugin.daemon_set)
    live = view.device_plugin
    if live is None:
        return missing_target("DaemonSet", plugin.namespace, plugin.daemon_set, "spec.devicePlugin.daemonSet",
                              "DevicePluginNotFound",
                              "install the device plugin or set spec.devicePlugin.namespace/daemonSet")
    try:
        check_workload(live, where, "spec.devicePlugin.daemonSet")
        index, container = find_container(live, plugin.container, where)
    except InputError as err:
        return failed_target("DaemonSet", plugin.namespace, plugin.daemon_set, live, err.problem)
    found = view.plugin
    if found.generation is None:
        return failed_target("DaemonSet", plugin.namespace, plugin.daemon_set, live, Problem(
            "spec.devicePlugin.generation", "PluginGenerationUnknown",
            f"{found.detail}; set spec.devicePlugin.generation to legacy (<= v1.11), current (v1.12+) "
            "or builtin", object=where))
    live_command, live_args = container_argv(container)
    edited = edited_container_argv(spec, container, found.generation)
    containers = copy.deepcopy(live["spec"]["template"]["spec"]["containers"])
    if edited.args != live_args:
        containers[index]["args"] = edited.args
    if edited.command != live_command:
        containers[index]["command"] = edited.command
    wanted: dict[str, Any] = {"args": edited.args}
    if live_command:
        wanted["command"] = edited.command
    inputs_changed = edited.args != live_args or edited.command != live_command
    if found.generation != "builtin":
        wanted["deviceConfig"] = device_config.owned_section(view)
        inputs_changed |= (
            device_config.plugin_reads(found.generation, view.live_device_config)
            != device_config.plugin_reads(found.generation, device_config.desired_config(view)))
    return workload_target("DaemonSet", live, ANNOTATION, short_hash(wanted), inputs_changed, containers,
                           view.running)
