"""`vgpu-monitor`: serve the containers' vGPU metrics on :9394/metrics."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from vgpu_deviceplugin.kube import ApiKubeClient, KubeError
from vgpu_deviceplugin.monitor.exporter import RegionCollector

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
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                   help="kubeconfig file (env KUBECONFIG); unset: in-cluster service account")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="log verbosity")
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
                pods = await kube.list_pods_on_node(node)
                collector.pod_names = {
                    p["metadata"]["uid"]: (p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods}
            except KubeError as exc:
                log.warning("cannot list pods on %s: %s", node, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), NAMES_REFRESH_SECONDS)
    finally:
        await kube.close()


async def serve(port: int, bind: str, containers_dir: str, node: str | None, kubeconfig: str | None,
                stop: asyncio.Event) -> None:
    registry = CollectorRegistry()
    collector = RegionCollector(containers_dir, {})
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


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def run() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await serve(args.port, args.bind, args.containers_dir, args.node_name, args.kubeconfig, stop)

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
