"""`vgpu-operator`: the process entry point. Parses the flags, serves the metrics, and runs the
operator (`runtime.run.run_operator`) until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
from collections.abc import Sequence

from vgpu_formats import kubeconfig

from vgpu_operator import logs, startup
from vgpu_operator.metrics import Metrics
from vgpu_operator.runtime.run import connection_from_kubeconfig, run_operator
from vgpu_operator.runtime.worker import Tuning
from vgpu_operator.settings import OperatorSettings, parse_args


async def _serve(settings: OperatorSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    metrics = Metrics()
    if settings.liveness_port:
        startup.check_port("--liveness-port", settings.liveness_port)
    if settings.metrics_port:
        startup.serve_metrics(metrics, settings.metrics_port)
    await run_operator(settings.kubeconfig, stop, namespaces=settings.namespaces,
                       peering=settings.peering, priority=settings.priority,
                       liveness_port=settings.liveness_port, metrics=metrics,
                       tuning=Tuning(resync_seconds=settings.resync_seconds),
                       api_timeout=settings.api_timeout_seconds)


def main(argv: Sequence[str] | None = None) -> None:
    """Exit 1 with one `vgpu-operator: error: ...` line on any failure (usage errors: 2)."""
    settings = parse_args(argv)
    logs.configure(settings.log_level, settings.log_format)
    server: str | None = None
    try:
        located = kubeconfig.locate(settings.kubeconfig)
        if located is not None:  # read now: a broken kubeconfig is a one-line error, not a login retry loop
            server = connection_from_kubeconfig(str(located)).server
        settings = dataclasses.replace(settings, kubeconfig=str(located) if located else None)
        asyncio.run(_serve(settings))
    except Exception as exc:
        traced = exc if settings.log_level <= logging.DEBUG else None
        startup.fail(startup.describe(exc, settings, server), traced, settings.log_format)


if __name__ == "__main__":
    main()
