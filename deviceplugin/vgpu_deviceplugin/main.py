"""`deviceplugin`: the console entry point. Flags -> Flags, then run_plugin until a signal."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from vgpu_formats import cli, kubeconfig
from vgpu_formats import device_config as dc
from vgpu_formats import node_config as nc

from vgpu_deviceplugin.config import (
    DEFAULT_CACHE_ROOT,
    DEFAULT_DEVICE_PLUGIN_DIR,
    DEFAULT_HOOK_PATH,
    DEFAULT_REGISTER_INTERVAL,
    Flags,
)
from vgpu_deviceplugin.gpus import GpuError
from vgpu_deviceplugin.kube import KubeError
from vgpu_deviceplugin.runner import run_plugin

log = logging.getLogger("vgpu_deviceplugin")

# Flags of the current upstream plugin (NVIDIA heritage) that have no meaning here (driver and
# device roots, CDI spec generation inputs, discovery, IMEX): accepted so an old DaemonSet still
# starts, with a warning. Upstream rejected unknown flags and crash-looped.
IGNORED_FLAGS = (
    "--driver-root", "--nvidia-driver-root", "--dev-root", "--nvidia-dev-root", "--nvidia-cdi-hook-path",
    "--nvidia-ctk-path", "--driver-root-ctr-path", "--container-driver-root", "--device-discovery-strategy",
    "--imex-channel-ids", "--imex-required", "--cdi-feature-flags",
)
# Go's strconv.ParseBool, which urfave/cli's BoolFlag uses for `--flag=VALUE` and its env variable.
GO_TRUE = ("1", "t", "T", "TRUE", "true", "True")
GO_FALSE = ("0", "f", "F", "FALSE", "false", "False")
DEFAULT_CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"  # upstream's default: by itself it turns nothing on


def go_bool(value: str) -> bool:
    if value in GO_TRUE:
        return True
    if value in GO_FALSE:
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {value!r} (true or false)")


@dataclasses.dataclass(frozen=True)
class Refused:
    """An upstream feature this plugin does not serve. A value that leaves it off is accepted
    silently (stock DaemonSets pass those); one that asks for it stops the start: running without
    a feature the DaemonSet asked for would break pods later and quietly."""

    flag: str
    env: str  # upstream's urfave/cli EnvVars name, read the same way
    off: Callable[[Any], bool]
    why: str
    # Neither flag nor env given: off (upstream defaults GDRCopy, GDS and MOFED to on; we cannot).
    default: str = ""


REFUSED = (
    Refused("--device-list-strategy", "DEVICE_LIST_STRATEGY",
            lambda v: all(s.strip() == "envvar" for s in str(v).split(",")),
            "only 'envvar' is served: volume-mounts and CDI (cdi-annotations, cdi-cri) need CDI specs "
            "this plugin does not generate; use --device-list-strategy=envvar or the upstream plugin",
            "envvar"),
    Refused("--cdi-annotation-prefix", "CDI_ANNOTATION_PREFIX",
            lambda v: v == DEFAULT_CDI_ANNOTATION_PREFIX,
            "CDI is not served (no CDI specs are generated); remove the flag",
            DEFAULT_CDI_ANNOTATION_PREFIX),
    Refused("--mps-root", "MPS_ROOT", lambda v: v == "",
            "MPS sharing is not served (GPUs are shared through HAMi-core limits); remove the flag"),
    Refused("--gdrcopy-enabled", "GDRCOPY_ENABLED", lambda v: v is False,
            "NVIDIA_GDRCOPY is not set in Allocate; set NVIDIA_GDRCOPY=enabled in the pod's env instead",
            "false"),
    Refused("--gds-enabled", "GDS_ENABLED", lambda v: v is False,
            "NVIDIA_GDS is not set in Allocate; set NVIDIA_GDS=enabled in the pod's env instead",
            "false"),
    Refused("--mofed-enabled", "MOFED_ENABLED", lambda v: v is False,
            "NVIDIA_MOFED is not set in Allocate; set NVIDIA_MOFED=enabled in the pod's env instead",
            "false"),
    Refused("--config-file", "CONFIG_FILE", lambda v: v == "",
            "the NVIDIA config file is not read: settings come from the device-config and node-config "
            "ConfigMaps (--device-config-name, --node-config-name); remove the flag"),
    Refused("--mig-strategy", "MIG_STRATEGY", lambda v: v == "none",
            "this plugin does not serve MIG; use the upstream plugin (generation current) on MIG nodes, "
            "or --mig-strategy=none", "none"),
)
BOOL_REFUSED = ("--gdrcopy-enabled", "--gds-enabled", "--mofed-enabled")


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


# Ours until the lock dir stopped being mounted (nothing reads it): accepted so a DaemonSet that
# still passes it starts, with the same warning.
LOCK_DIR_FLAG = "--lock-dir"
# klog's verbosity (`-v=4`, `--v=4`, `-v 4`), which the upstream Go plugin takes and its DaemonSets
# pass: 4 and up (klog's debug range) is --log-level debug, lower is the default. `-v` alone is
# --verbose, as in every command of the project.
KLOG_VERBOSITY = re.compile(r"--?v=(\d+)")
KLOG_DEBUG = 4


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="deviceplugin",
        description="Volcano vGPU device plugin (drop-in for volcano-vgpu-device-plugin). Resource names "
        "and device settings come from the device-config ConfigMap the Volcano scheduler reads, per-node "
        "settings from the node-config ConfigMap; flags only fill what the ConfigMaps leave out.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    env = os.environ.get
    p.add_argument("--node-name", default=env("NODE_NAME"),
                   help="this node's name (env NODE_NAME; the DaemonSet passes spec.nodeName)")
    p.add_argument("--device-plugin-dir", default=DEFAULT_DEVICE_PLUGIN_DIR,
                   help="kubelet device-plugin directory holding kubelet.sock; the plugin's sockets go here")
    p.add_argument("--kubelet-socket", default=env("KUBELET_SOCKET"),
                   help="path of kubelet.sock (upstream HEAD flag, env KUBELET_SOCKET); its folder becomes "
                   "--device-plugin-dir")
    p.add_argument("--device-config-name", default=dc.CONFIGMAP_NAME,
                   help="device-config ConfigMap (key device-config.yaml), the one the scheduler reads")
    p.add_argument("--device-config-namespace", default=None,
                   help="namespace of the device-config ConfigMap; unset: kube-system, then volcano-system")
    p.add_argument("--node-config-name", default=nc.CONFIGMAP_NAME,
                   help="node-config ConfigMap (key config.json); the entry named like this node applies")
    p.add_argument("--node-config-namespace", default=None,
                   help="namespace of the node-config ConfigMap; unset: where the device-config was found")
    p.add_argument("--mock-gpus", default=env("VGPU_MOCK_GPUS"), metavar="SPEC",
                   help="use mock GPUs instead of NVML (env VGPU_MOCK_GPUS), e.g. 8xA100-80GB, 2xRTX4090, "
                   "1xA100-40GB,1xT4 or 2xMyGPU:16384 (MiB)")
    p.add_argument("--hook-path", default=env("HOOK_PATH", DEFAULT_HOOK_PATH),
                   help="host directory with libvgpu.so and ld.so.preload (env HOOK_PATH); mounted into pods")
    p.add_argument("--cache-root", default=DEFAULT_CACHE_ROOT,
                   help="host directory for the per-container shared regions (<root>/containers/<pod-uid>_"
                   "<container>); vgpu-monitor --containers-dir must be <root>/containers")
    p.add_argument("--register-interval", type=float, default=DEFAULT_REGISTER_INTERVAL,
                   help="seconds between node annotation writes (the handshake needs 60 or less)")
    p.add_argument("--no-handshake", dest="handshake", action="store_false",
                   help="do not write volcano.sh/node-vgpu-handshake (only Volcano <= v1.15.0 needs it)")
    p.add_argument("--allow-disable-control", action="store_true",
                   help="honour a container env named CUDA_DISABLE_CONTROL, as upstream always does: "
                   "no /etc/ld.so.preload, so no libvgpu.so and no memory or SM limit on a shared GPU. "
                   "Without it such a pod fails Allocate with an error naming the variable")
    p.add_argument("--kubeconfig", default=None,
                   help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else the in-cluster "
                   "service account)")
    cli.add_common_flags(p)
    legacy = p.add_argument_group(
        "legacy flags", "Accepted for compatibility with volcano-vgpu-device-plugin. Each applies only when "
        "the device-config ConfigMap leaves the field out; a flag that contradicts it is ignored with a "
        "warning (a flag winning is how resource names drifted from the scheduler's).")
    legacy.add_argument("--resource-name", help="count resource (ConfigMap resourceCountName)")
    legacy.add_argument("--resource-memory-name", help="memory resource (ConfigMap resourceMemoryName)")
    legacy.add_argument("--resource-core-name", help="cores resource (ConfigMap resourceCoreName)")
    legacy.add_argument("--device-split-count", type=int, help="tasks per GPU (ConfigMap deviceSplitCount)")
    legacy.add_argument("--gpu-memory-factor", type=int,
                        help="MiB per memory unit (ConfigMap gpuMemoryFactor)")
    legacy.add_argument("--device-cores-scaling", type=float,
                        help="cores per GPU = 100 x this (ConfigMap deviceCoreScaling)")
    upstream = p.add_argument_group(
        "upstream flags", "The current upstream plugin's flags with a meaning here; each defaults to "
        "its upstream environment variable (named in the help), as urfave/cli reads it.")
    upstream.add_argument("--mig-strategy", default=env("MIG_STRATEGY", "none"),
                          choices=["none", "single", "mixed"],
                          help="env MIG_STRATEGY; only 'none' is served, single or mixed exit 1 at start")
    upstream.add_argument("--fail-on-init-error", default=env("FAIL_ON_INIT_ERROR", "true"), type=go_bool,
                          nargs="?", const=True, metavar="BOOL",
                          help="env FAIL_ON_INIT_ERROR; GPU discovery failure: exit (true) or wait idle "
                          "(false)")
    upstream.add_argument("--pass-device-specs", default=env("PASS_DEVICE_SPECS", "false"), type=go_bool,
                          nargs="?", const=True, metavar="BOOL",
                          help="env PASS_DEVICE_SPECS; Allocate also returns the device nodes (/dev/nvidiaN, "
                          "and /dev/nvidiactl, -uvm, -uvm-tools, -modeset where present)")
    upstream.add_argument("--device-id-strategy", default=env("DEVICE_ID_STRATEGY", "uuid"),
                          choices=["uuid", "index"],
                          help="env DEVICE_ID_STRATEGY; NVIDIA_VISIBLE_DEVICES as GPU UUIDs or NVML indexes")
    for refused in REFUSED:
        if refused.flag == "--mig-strategy":
            continue
        if refused.flag in BOOL_REFUSED:
            upstream.add_argument(refused.flag, dest=_dest(refused.flag),
                                  default=env(refused.env, refused.default), type=go_bool,
                                  nargs="?", const=True, metavar="BOOL",
                                  help=f"env {refused.env}; not served: only false is accepted")
        else:
            upstream.add_argument(refused.flag, dest=_dest(refused.flag), metavar="VALUE",
                                  default=env(refused.env, refused.default),
                                  help=f"env {refused.env}; not served: a value that asks for it exits 1")
    legacy.add_argument("--debug", action="store_true", help="same as --log-level debug")
    for name in IGNORED_FLAGS:
        dest = "ignored_" + name[2:].replace("-", "_")
        legacy.add_argument(name, dest=dest, default=None, nargs="?", const="true", metavar="VALUE",
                            help="accepted, no effect (NVIDIA device plugin option)")
    legacy.add_argument(LOCK_DIR_FLAG, dest="ignored_lock_dir", default=None, metavar="DIR",
                        help="accepted, no effect: HAMi-core's /tmp/vgpulock is no longer mounted "
                        "into vGPU containers (our libvgpu.so does not use it)")
    return p


def klog_verbosity(argv: Sequence[str]) -> list[str]:
    """`argv` with klog's `-v=N` forms turned into --log-level (see KLOG_VERBOSITY)."""
    result: list[str] = []
    index = 0
    while index < len(argv):
        item, index = argv[index], index + 1
        match = KLOG_VERBOSITY.fullmatch(item)
        if match is None and item in ("-v", "--v") and index < len(argv) and argv[index].isdigit():
            match, index = KLOG_VERBOSITY.fullmatch(f"-v={argv[index]}"), index + 1
        if match is None:
            result.append(item)
        elif int(match.group(1)) >= KLOG_DEBUG:
            result += ["--log-level", "debug"]
    return result


def refused(args: argparse.Namespace) -> str | None:
    """The one-line reason to stop for the first flag (or env variable) that asks for a feature
    this plugin does not serve; None when every one of them is off."""
    for r in REFUSED:
        value = getattr(args, _dest(r.flag))
        if not r.off(value):
            shown = str(value).lower() if isinstance(value, bool) else value
            return f"{r.flag}={shown} (or env {r.env}) is not supported: {r.why}"
    return None


def install_signals(stop: asyncio.Event, reload: asyncio.Event) -> None:
    """SIGINT, SIGTERM, SIGQUIT stop; SIGHUP re-reads the ConfigMaps and registers again, as
    upstream's SIGHUP restarts its plugins without exiting."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reload.set)


def flags_from(args: argparse.Namespace) -> Flags:
    """Flags has a field per flag, same names as the argparse destinations."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(Flags) if hasattr(args, f.name)}
    if args.kubelet_socket:
        values["device_plugin_dir"] = os.path.dirname(args.kubelet_socket)
    for optional in ("mock_gpus", "kubeconfig"):  # an empty env value means unset
        values[optional] = values[optional] or None
    return Flags(**values)


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 1 with one `deviceplugin: error: ...` line when it cannot run (usage errors: 2)."""
    p = parser()
    args = p.parse_args(klog_verbosity(sys.argv[1:] if argv is None else argv))
    level = logging.DEBUG if args.debug else cli.log_level(args)
    cli.configure_logging(level, args.log_format)
    if not args.node_name:
        p.error("--node-name (or env NODE_NAME) is required")
    for name in (*IGNORED_FLAGS, LOCK_DIR_FLAG):
        if getattr(args, "ignored_" + name[2:].replace("-", "_")) is not None:
            log.warning("flag %s has no effect in this plugin; remove it", name)
    # choices are not checked on a default, which may come from the environment
    for name, env, choices in (("mig_strategy", "MIG_STRATEGY", ("none", "single", "mixed")),
                               ("device_id_strategy", "DEVICE_ID_STRATEGY", ("uuid", "index"))):
        if getattr(args, name) not in choices:
            p.error(f"env {env}={getattr(args, name)!r}: expected one of {', '.join(choices)}")
    refusal = refused(args)
    if refusal:
        return cli.report("deviceplugin", refusal, None, args.log_format)
    traced = level <= logging.DEBUG
    try:
        located = kubeconfig.locate(args.kubeconfig)
        if located is not None:
            kubeconfig.read(located)  # a broken file: one line now, not an API retry loop
        args.kubeconfig = str(located) if located else None
        asyncio.run(_serve(flags_from(args), fail_on_init_error=args.fail_on_init_error))
    except (GpuError, KubeError, kubeconfig.KubeconfigError, OSError) as exc:
        return cli.report("deviceplugin", str(exc), exc if traced else None, args.log_format)
    return 0


async def _serve(flags: Flags, fail_on_init_error: bool) -> None:
    stop, reload = asyncio.Event(), asyncio.Event()
    install_signals(stop, reload)
    try:
        await run_plugin(flags, stop, reload=reload)
    except GpuError as exc:
        if fail_on_init_error:
            raise
        log.error("%s; waiting idle (--fail-on-init-error=false)", exc)
        await stop.wait()


if __name__ == "__main__":
    sys.exit(main())
