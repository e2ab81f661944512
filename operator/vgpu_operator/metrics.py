"""Prometheus metrics of the operator. The names are a contract: the Helm chart's dashboard and
alerts use exactly these."""

from __future__ import annotations

from collections.abc import Iterable
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from vgpu_formats.cli import version

from vgpu_operator.plan import Restart


class Metrics:
    """One set per operator process; tests make their own registry to stay independent."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.reconciles = Counter(
            "vgpu_operator_reconciles", "Reconciles, by result (ok, invalid, conflict, error, paused).",
            ["result"], registry=self.registry)
        self.duration = Histogram(
            "vgpu_operator_reconcile_duration_seconds", "Time one reconcile took.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=self.registry)
        self.drift_repairs = Counter(
            "vgpu_operator_drift_repairs", "Targets restored after a hand edit (driftPolicy Enforce).",
            registry=self.registry)
        self.restarts = Counter(
            "vgpu_operator_restarts", "Restarts triggered, by kind (scheduler, daemonset, plugin-pod).",
            ["kind"], registry=self.registry)
        self.nodes_converged = Gauge(
            "vgpu_operator_nodes_converged", "GPU nodes advertising what the active policy says.",
            registry=self.registry)
        self.policy_ready = Gauge(
            "vgpu_operator_policy_ready", "1 when the active VGPUPolicy is Ready.", registry=self.registry)
        # Without it, "not Ready" and "no policy at all" (chart installed with policy.create=false,
        # the policy deleted) would read the same 0.
        self.policy_present = Gauge(
            "vgpu_operator_policy_present", "1 while a VGPUPolicy is active (the policy gauges "
            "describe it); 0 when there is none.", registry=self.registry)
        self.active = Gauge(
            "vgpu_operator_active", "1 while this replica is the one reconciling (with peering, "
            "exactly one is); the others export 0 for every policy gauge.", registry=self.registry)
        # Always 1: `vgpu_operator_build_info` joins any series to the version that produced it.
        self.build_info = Gauge(
            "vgpu_operator_build_info", "Always 1; the version of the running operator.", ["version"],
            registry=self.registry)
        self.build_info.labels(version=version()).set(1)
        for result in ("ok", "invalid", "conflict", "error", "paused"):
            self.reconciles.labels(result=result)  # export zeros, so rate() works from the start
        for kind in ("scheduler", "daemonset", "plugin-pod"):
            self.restarts.labels(kind=kind)

    def record_restarts(self, restarts: Iterable[Restart]) -> None:
        for restart in restarts:
            self.restarts.labels(kind=restart.kind).inc()

    def set_active(self, active: bool) -> None:
        """A paused replica's last readings go stale: zero them, so `max()` over the replicas
        reads the one that works."""
        self.active.set(1 if active else 0)
        if not active:
            self.no_policy()

    def no_policy(self) -> None:
        """No active policy here (none exists, or this replica is paused): the policy gauges read 0."""
        self.policy_present.set(0)
        self.policy_ready.set(0)
        self.nodes_converged.set(0)

    def serve(self, port: int, addr: str = "0.0.0.0") -> WSGIServer:
        """Expose /metrics on a port (a daemon thread, as prometheus-client does it); the server is
        returned so a test can `shutdown()` it."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server
