"""Two operator replicas with kopf peering: exactly one writes, the other takes over when it stops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from vgpu_emulator import RunningEmulator, run_emulator
from vgpu_operator.metrics import Metrics
from vgpu_operator.runtime.run import run_operator
from vgpu_operator.runtime.worker import Tuning
from vgpu_operator.settings import start_time_priority

from tests.support.waiting import eventually

from .conftest import FIXTURES, RESYNC, Cluster, plugin_pods

PEERING = "vgpu-operator"
DEVICE_CONFIG = "volcano-vgpu-device-config"
KEY = "device-config.yaml"


@dataclass
class Replica:
    """One operator process (an asyncio task here), with its own metrics."""

    name: str
    metrics: Metrics = field(default_factory=Metrics)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[object] | None = None

    def start(self, running: RunningEmulator, priority: int) -> None:
        self.task = asyncio.create_task(run_operator(
            str(running.kubeconfig), self.stop, peering=PEERING, priority=priority, identity=self.name,
            metrics=self.metrics, tuning=Tuning(resync_seconds=RESYNC)))

    async def halt(self) -> None:
        self.stop.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, timeout=10)

    def value(self, name: str) -> float:
        """An unlabelled gauge or counter of this replica."""
        return float(getattr(self.metrics, name)._value.get())

    def reconciles(self) -> float:
        return sum(float(self.metrics.reconciles.labels(result=r)._value.get())
                   for r in ("ok", "invalid", "conflict", "error", "paused"))


@contextlib.asynccontextmanager
async def two_replicas() -> AsyncIterator[tuple[Cluster, Replica, Replica]]:
    async with run_emulator(FIXTURES / "cluster") as running:
        plugin_pods(running.emulator)
        running.emulator.apply({"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
                                "metadata": {"name": PEERING}})
        first, second = Replica("replica-a"), Replica("replica-b")
        try:
            yield Cluster(running, first.metrics), first, second
        finally:
            for replica in (first, second):
                if replica.task is not None and not replica.task.done():
                    await replica.halt()


async def steady(read: Callable[[], float], quiet: float) -> float:
    """The value once it has not changed for `quiet` seconds."""
    value = read()
    while True:
        await asyncio.sleep(quiet)
        if read() == value:
            return value
        value = read()


def _scribble(cm: dict[str, object]) -> None:
    data = cm["data"]
    assert isinstance(data, dict)
    data[KEY] = data[KEY].replace("deviceSplitCount: 10", "deviceSplitCount: 3")


async def _repaired(cluster: Cluster) -> None:
    await eventually(lambda: "deviceSplitCount: 3" not in cluster.data(DEVICE_CONFIG, KEY), what="repair")


async def test_older_replica_works_the_younger_waits_then_takes_over() -> None:
    async with two_replicas() as (cluster, first, second):
        first.start(cluster.running, start_time_priority())
        cluster.create_policy()
        await cluster.ready()
        second.start(cluster.running, start_time_priority())  # started later: lower priority

        await asyncio.sleep(6 * RESYNC)
        cluster.edit("ConfigMap", "kube-system", DEVICE_CONFIG, _scribble)
        await _repaired(cluster)
        await asyncio.sleep(4 * RESYNC)
        assert second.reconciles() == 0, "the waiting replica never reconciles"
        assert first.reconciles() > 0

        await first.halt()  # a graceful stop removes its peering entry: the other resumes
        cluster.edit("ConfigMap", "kube-system", DEVICE_CONFIG, _scribble)
        await _repaired(cluster)
        # The repair write comes first; the counters follow when that reconcile has finished.
        await eventually(lambda: second.value("drift_repairs") == 1 and second.reconciles(),
                         what="the second replica's repair counted")


async def test_a_replica_paused_by_a_higher_priority_peer_stops_its_own_resyncs() -> None:
    async with two_replicas() as (cluster, first, second):
        first.start(cluster.running, priority=10)
        cluster.create_policy()
        await cluster.ready()
        await eventually(lambda: first.reconciles() > 2, what="first replica resyncing")

        assert first.value("active") == 1 and first.value("policy_ready") == 1

        second.start(cluster.running, priority=20)  # outranks the running one: it pauses
        await eventually(lambda: second.reconciles() > 0, what="second replica working")
        await eventually(lambda: first.value("active") == 0, what="first replica paused")
        paused_at = await steady(first.reconciles, quiet=2 * RESYNC)  # a resync under way ends

        cluster.edit("ConfigMap", "kube-system", DEVICE_CONFIG, _scribble)
        await _repaired(cluster)
        await asyncio.sleep(8 * RESYNC)  # many resync periods of the paused replica
        assert first.reconciles() == paused_at, "a paused replica's worker must not write"
        await eventually(lambda: second.value("drift_repairs") == 1,
                         what="the second replica's repair counted")
        # Dashboards take max/sum over replicas: only the working one reports the policy.
        assert second.value("active") == 1 and second.value("policy_ready") == 1
        assert first.value("policy_ready") == 0 and first.value("nodes_converged") == 0
        assert second.value("nodes_converged") > 0
