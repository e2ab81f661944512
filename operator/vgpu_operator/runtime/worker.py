"""The worker: when to reconcile, and the one retry policy of a failed reconcile.

Reconciles of the active policy run here and nowhere else, one at a time: soon after a trigger
(a policy or node event, a change of a watched target; bursts coalesce), every resync period as a
safety net, and after a failure again with backoff (`Tuning.error_backoff_seconds`), until one
succeeds. kopf handlers only record what they saw and trigger; they never retry a reconcile.
(Single API calls have their own short retry of transient errors in `k8s.Kube`.)

With peering, kopf stops a paused replica's daemons: the policy's daemon calls `start_working` /
`stop_working`, and the worker reconciles only policies some daemon of this replica runs for, so
one replica writes at a time.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from vgpu_operator.metrics import Metrics
from vgpu_operator.reconcile import NODES_TIMEOUT_SECONDS, Reconciler
from vgpu_operator.runtime.watching import BACKOFF_SECONDS, backoff_delay

# A reconcile that keeps failing (an admission policy refusing a write, an immutable ConfigMap)
# is retried ever more slowly, up to twice a minute: each try re-reads every target.
RECONCILE_BACKOFF_SECONDS = (*BACKOFF_SECONDS, 10.0, 30.0)


@dataclass
class Tuning:
    """Timings of the runtime (short by default: failures show within a second)."""

    resync_seconds: float = 60.0
    debounce_seconds: float = 0.02
    error_backoff_seconds: tuple[float, ...] = RECONCILE_BACKOFF_SECONDS
    nodes_timeout_seconds: float = NODES_TIMEOUT_SECONDS  # how long a reconcile waits for the first node list


class Worker:
    """Runs `reconciler.reconcile(name)` on triggers, resyncs and retries: always for the active
    policy, and once for each other policy named in a trigger (it reports its Conflict)."""

    def __init__(self, reconciler: Reconciler, metrics: Metrics, tuning: Tuning | None = None) -> None:
        self.reconciler = reconciler
        self.metrics = metrics
        self.tuning = tuning or Tuning()
        self._wake = asyncio.Event()
        self._failures = 0
        self._named: set[str] = set()  # policies to reconcile besides the active one
        self.working: set[str] = set()  # policies whose kopf daemon runs in this replica

    def trigger(self, name: str | None = None) -> None:
        """Ask for a reconcile of the active policy soon, and of `name` if given."""
        if name is not None:
            self._named.add(name)
        self._wake.set()

    def start_working(self, name: str) -> None:
        self.working.add(name)
        self.reconciler.paused = False
        self.metrics.set_active(True)
        self.trigger(name)  # taking over (start, or after a peering pause): resync now

    def stop_working(self, name: str) -> None:
        self.working.discard(name)
        self.reconciler.paused = not self.working
        self.metrics.set_active(bool(self.working))

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            delay = self.tuning.resync_seconds
            if self._failures:
                delay = backoff_delay(self._failures, self.tuning.error_backoff_seconds)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=delay)
                await asyncio.sleep(self.tuning.debounce_seconds)
            except TimeoutError:
                pass
            self._wake.clear()
            active = self.reconciler.policies.active()
            names, self._named = self._named | ({active} if active else set()), set()
            failed: set[str] = set()
            for name in sorted(names, key=lambda n: (n != active, n)):
                if name in self.working and not stop.is_set() and not await self.reconciler.reconcile(name):
                    failed.add(name)
            self._failures = self._failures + 1 if failed else 0
            self._named |= failed - {active}  # the active one is retried anyway
