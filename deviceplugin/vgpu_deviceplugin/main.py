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
from collections.abc import Sequence

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

# Flags of the current upstream plugin (NVIDIA heritage) that have no meaning here: accepted so an
# old DaemonSet still starts, with a warning. Upstream rejected unknown flags and crash-looped.
IGNORED_FLAGS = (
    "--driver-root", "--nvidia-driver-root", "--dev-root", "--nvidia-dev-root", "--pass-device-specs",
    "--device-list-strategy", "--device-id-strategy", "--gdrcopy-enabled", "--gds-enabled",
    "--mofed-enabled", "--cdi-annotation-prefix", "--nvidia-cdi-hook-path", "--nvidia-ctk-path",
    "--driver-root-ctr-path", "--container-driver-root", "--mps-root", "--device-discovery-strategy",
    "--imex-channel-ids", "--imex-required", "--config-file", "--cdi-feature-flags",
)
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
    p.add_argument("--kubelet-socket", default=None,
                   help="path of kubelet.sock (upstream HEAD flag); its folder becomes --device-plugin-dir")
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
    legacy.add_argument("--mig-strategy", default="none", choices=["none", "single", "mixed"],
                        help="only 'none' is served; others log a warning")
    legacy.add_argument("--fail-on-init-error", default="true", choices=["true", "false"],
                        help="GPU discovery failure: exit (true) or wait idle (false)")
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
    traced = level <= logging.DEBUG
    try:
        located = kubeconfig.locate(args.kubeconfig)
        if located is not None:
            kubeconfig.read(located)  # a broken file: one line now, not an API retry loop
        args.kubeconfig = str(located) if located else None
        asyncio.run(_serve(flags_from(args), fail_on_init_error=args.fail_on_init_error == "true"))
    except (GpuError, KubeError, kubeconfig.KubeconfigError, OSError) as exc:
        return cli.report("deviceplugin", str(exc), exc if traced else None, args.log_format)
    return 0


async def _serve(flags: Flags, fail_on_init_error: bool) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await run_plugin(flags, stop)
    except GpuError as exc:
        if fail_on_init_error:
            raise
        log.error("%s; waiting idle (--fail-on-init-error=false)", exc)
        await stop.wait()


if __name__ == "__main__":
    sys.exit(main())
