"""`vgpu-monitor`: serve the containers' vGPU metrics on :9394/metrics."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import logging
import os
import signal
import sys
from collections.abc import Sequence

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from vgpu_formats import cli, kubeconfig

from vgpu_deviceplugin.kube import ApiKubeClient, KubeError
from vgpu_deviceplugin.monitor.exporter import RegionCollector
from vgpu_deviceplugin.monitor.host import HostGpuSource
from vgpu_deviceplugin.monitor.pods import PodView

log = logging.getLogger("vgpu_deviceplugin.monitor")
NAMES_REFRESH_SECONDS = 30.0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vgpu-monitor", description=__doc__,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--port", type=int, default=9394, help="HTTP port of /metrics")
    p.add_argument("--bind", default="0.0.0.0", help="address to listen on")
    p.add_argument("--containers-dir", default="/tmp/vgpu/containers",
                   help="the per-container region dirs: the device plugin's --cache-root + /containers")
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME"),
                   help="this node (env NODE_NAME): pod names come from a field-selected pod list; "
                   "without it (or without API access) metrics carry the pod UID only")
    p.add_argument("--no-legacy-metrics", dest="legacy_metrics", action="store_false",
                   help="export the snake_case names only, not upstream's twins (HostGPUMemoryUsage, ...) "
                   "that dashboards built for upstream query")
    p.add_argument("--kubeconfig", default=None,
                   help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else the in-cluster "
                   "service account)")
    cli.add_common_flags(p)
    return p


async def _refresh_names(collector: RegionCollector, node: str, kubeconfig: str | None,
                         stop: asyncio.Event) -> None:
    try:
        kube = await ApiKubeClient.connect(kubeconfig)
    except (KubeError, OSError, ValueError) as exc:
        log.warning("no Kubernetes API (%s): metrics will carry pod UIDs only", exc)
        return
    try:
        while not stop.is_set():
            try:
                collector.pods = PodView.of(await kube.list_pods_on_node(node))
            except KubeError as exc:
                log.warning("cannot list pods on %s: %s", node, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), NAMES_REFRESH_SECONDS)
    finally:
        await kube.close()


async def serve(port: int, bind: str, containers_dir: str, node: str | None, kubeconfig: str | None,
                stop: asyncio.Event, host: HostGpuSource | None = None, legacy: bool = True) -> None:
    """`host`: where the whole-card figures come from; None: NVML (tests pass a fake). `legacy`:
    upstream's names too (--no-legacy-metrics turns them off)."""
    registry = CollectorRegistry()
    collector = RegionCollector(containers_dir, PodView(), host, legacy)
    registry.register(collector)

    async def handle(_: web.Request) -> web.Response:
        body = await asyncio.to_thread(generate_latest, registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, bind, port).start()
    log.info("serving %s on %s:%d/metrics", containers_dir, bind, port)
    names = asyncio.create_task(_refresh_names(collector, node, kubeconfig, stop)) if node else None
    try:
        await stop.wait()
    finally:
        if names is not None:
            names.cancel()
        await runner.cleanup()


def _kubeconfig(explicit: str | None) -> str | None:
    """The kubeconfig for pod names. One that was asked for (flag, $KUBECONFIG) and is missing
    is an error; none at all only costs the names (`_refresh_names` says so)."""
    try:
        located = kubeconfig.locate(explicit)
    except kubeconfig.KubeconfigError:
        if explicit or os.environ.get("KUBECONFIG"):
            raise
        return None
    if located is not None:
        kubeconfig.read(located)  # a broken file: one line now, not a warning later
    return str(located) if located else None


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 1 with one `vgpu-monitor: error: ...` line when it cannot start (usage errors: 2)."""
    args = parser().parse_args(argv)
    level = cli.log_level(args)
    cli.configure_logging(level, args.log_format)

    async def run(config: str | None) -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await serve(args.port, args.bind, args.containers_dir, args.node_name, config, stop,
                    legacy=args.legacy_metrics)

    traced = level <= logging.DEBUG  # --log-level debug: the traceback too, as the other daemons
    try:
        config = _kubeconfig(args.kubeconfig) if args.node_name else None
        asyncio.run(run(config))
    except kubeconfig.KubeconfigError as exc:
        cli.fail("vgpu-monitor", str(exc), exc if traced else None, args.log_format)
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):  # the listening socket
            cli.fail("vgpu-monitor", f"--bind {args.bind} --port {args.port}: {exc.strerror}; pick a free "
                     f"port or address", exc if traced else None, args.log_format)
        cli.fail("vgpu-monitor", str(exc), exc if traced else None, args.log_format)
    return 0


if __name__ == "__main__":
    sys.exit(main())
