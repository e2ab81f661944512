"""Operator settings: command-line flags, and how they become kopf settings."""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import kopf
from vgpu_formats import cli

from vgpu_operator import api
from vgpu_operator.k8s import DEFAULT_TIMEOUT

PREFIX = api.GROUP  # kopf's own marks (finalizer, progress annotations) live under vgpu.io


@dataclass
class OperatorSettings:
    """Everything `vgpu-operator` can be told on its command line."""

    namespaces: list[str] = field(default_factory=list)
    peering: str | None = None
    liveness_port: int | None = 8080
    metrics_port: int | None = 9090
    kubeconfig: str | None = None  # the flag as given; `main` resolves it (kubeconfig.locate)
    log_level: int = logging.INFO
    log_format: str = "text"
    resync_seconds: float = 60.0
    priority: int | None = None
    api_timeout_seconds: float = DEFAULT_TIMEOUT

    @property
    def standalone(self) -> bool:
        """No peering: the only replica (`--standalone` is the default and only names it)."""
        return self.peering is None


def start_time_priority(now_ns: int | None = None) -> int:
    """A kopf peering priority that makes the OLDEST replica the active one.

    kopf pauses every operator whose peers share its priority, so replicas need distinct ones.
    Older-wins (rather than random) means a replica started later never takes over from a
    running one: it stays paused, with empty indexes, until the active replica's peering entry
    expires, so two replicas never reconcile at once. Microseconds keep ties improbable and the
    value stays within JSON's exact integer range.
    """
    now_us = (now_ns if now_ns is not None else time.time_ns()) // 1000
    return 2**53 - now_us


def parse_args(argv: Sequence[str] | None = None) -> OperatorSettings:
    parser = argparse.ArgumentParser(
        prog="vgpu-operator",
        description="Keeps Volcano's vGPU configuration (device-config, node-config, scheduler conf, "
                    "device plugin) consistent with the cluster's VGPUPolicy.")
    parser.add_argument("--namespace", "-n", action="append", default=[], dest="namespaces",
                        help="namespace holding the scheduler, the device plugin or the ConfigMaps "
                             "(repeat; default: all namespaces). VGPUPolicy and Nodes are always "
                             "watched cluster-wide.")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--standalone", action="store_true", default=True,
                      help="run without peering (one replica; the default)")
    mode.add_argument("--peering", metavar="NAME",
                      help="coordinate replicas through the ClusterKopfPeering NAME (needs kopf's CRDs)")
    parser.add_argument("--priority", type=int, default=_env_int("VGPU_OPERATOR_PRIORITY"),
                        help="kopf peering priority of this replica, highest works, the others "
                             "wait (env VGPU_OPERATOR_PRIORITY; default with --peering: older "
                             "replicas win, from the start time)")
    parser.add_argument("--liveness-port", type=int, default=8080,
                        help="serve http://0.0.0.0:PORT/healthz (0 disables)")
    parser.add_argument("--metrics-port", type=int, default=9090,
                        help="serve Prometheus metrics on http://0.0.0.0:PORT/metrics (0 disables)")
    parser.add_argument("--kubeconfig", metavar="PATH",
                        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else the "
                             "in-cluster service account)")
    parser.add_argument("--resync", type=float, default=60.0, metavar="SECONDS",
                        help="periodic safety reconcile interval")
    parser.add_argument("--api-timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help="deadline of every API request (watches: of their connection); a request "
                             "that runs past it fails the reconcile, which is retried with backoff")
    cli.add_common_flags(parser)
    args = parser.parse_args(argv)
    return OperatorSettings(
        namespaces=list(args.namespaces), peering=args.peering,
        liveness_port=args.liveness_port or None, metrics_port=args.metrics_port or None,
        kubeconfig=args.kubeconfig, log_level=cli.log_level(args), log_format=args.log_format,
        resync_seconds=args.resync,
        api_timeout_seconds=args.api_timeout,
        priority=args.priority if args.priority is not None or args.peering is None
        else start_time_priority(),
    )


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value else None


def configure_kopf(settings: kopf.OperatorSettings, api_timeout: float = DEFAULT_TIMEOUT) -> None:
    """kopf behaviour the operator relies on.

    Kubernetes Events are posted by the operator itself (one per write, restart, repair or
    rejection); kopf's own posting of every log line would write an Event per handler run, so it
    only posts warnings. Marks live under vgpu.io. Backoffs are short so failures show quickly.
    """
    settings.posting.level = logging.WARNING
    # No cluster-wide list/watch of Namespaces and CRDs (kopf's scanning, which the chart does not
    # grant): the namespaces are the exact ones given, the resources are discovered once at start.
    settings.scanning.disabled = True
    settings.persistence.finalizer = f"{PREFIX}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration")
    settings.batching.error_delays = (0.1, 0.2, 0.5, 1, 2, 5, 10)
    settings.watching.reconnect_backoff = 0.1
    # No request of kopf's may hang forever either: a watch the server stops answering is cut
    # after its own timeout plus the request deadline.
    settings.networking.request_timeout = api_timeout
    settings.networking.connect_timeout = api_timeout
    settings.watching.server_timeout = 300
    settings.watching.connect_timeout = api_timeout
    settings.watching.client_timeout = settings.watching.server_timeout + api_timeout
