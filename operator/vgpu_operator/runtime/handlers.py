"""kopf handlers: thin. Each one records what it saw and tells the worker; none reconciles or
retries (the worker does both, with its one backoff: `runtime.worker`).

* VGPUPolicy events               -> keep the policy index (which one is active, latest state)
* VGPUPolicy create/update/resume -> a new spec (or a restart): reconcile soon
* VGPUPolicy delete               -> leave the cluster working: remove our ownership labels only
* VGPUPolicy daemon               -> mark the policy "worked on by this replica" while it runs:
                                     kopf stops daemons when peering pauses a replica, so this is
                                     how the worker (outside kopf) pauses too
(Nodes are followed by `runtime.nodes`, and the policy's targets by `runtime.targets`, not kopf:
see there why.)

The periodic safety resync is the worker's (one loop, for the active policy), not a kopf timer per
policy: a timer would duplicate it, and kopf holds a deleted policy's finalizer until its timer has
exited.

Handlers are registered on a fresh registry per operator run (`register`), bound to one worker:
no module-level state, so tests can run operators one after another in one process.
"""

from __future__ import annotations

from typing import Any

import kopf

from vgpu_operator import api
from vgpu_operator.reconcile import Reconciler
from vgpu_operator.runtime.worker import Worker


def release_delay(retry: int) -> float:
    """Seconds before the release's next try: 0.2 s doubling per retry, at most a minute."""
    return min(60.0, 0.2 * 2 ** min(retry, 10))


def register(registry: kopf.OperatorRegistry, reconciler: Reconciler, worker: Worker) -> None:
    """Register every handler of the operator on `registry`."""
    policies = (api.GROUP, api.VERSION, api.PLURAL)
    index = reconciler.policies
    # Explicit ids: kopf's default is the qualified name, so its lines would read
    # "Handler 'register.<locals>.policy_changed' succeeded".

    @kopf.on.event(*policies, registry=registry, id="policy_seen")
    async def policy_seen(type: str | None, body: kopf.Body, **_: Any) -> None:
        before = index.active()
        index.update(body, deleted=type == "DELETED")
        if index.active() != before:
            worker.trigger()  # another policy became active (the old one left or stepped aside)

    @kopf.on.resume(*policies, registry=registry, id="policy_changed")
    @kopf.on.create(*policies, registry=registry, id="policy_changed")
    @kopf.on.update(*policies, registry=registry, field="spec", id="policy_changed")
    async def policy_changed(body: kopf.Body, **_: Any) -> None:
        index.update(body)
        worker.trigger(body.metadata.name)

    @kopf.on.delete(*policies, registry=registry, id="policy_deleted")
    async def policy_deleted(name: str, body: kopf.Body, retry: int, **_: Any) -> None:
        index.update(body)
        if index.active(including_deleted=True) != name:
            index.update(body, deleted=True)
            return  # a conflicting policy never wrote anything
        try:
            await reconciler.release(name, dict(body))
        except Exception as exc:
            # kopf retries this one (it holds the finalizer): after 0.2 s, doubling up to a minute,
            # so a passing outage is ridden out quickly and a lasting one does not spin.
            raise kopf.TemporaryError(f"releasing the policy's targets failed: {exc}",
                                      delay=release_delay(retry)) from exc
        worker.trigger()  # an older-but-conflicting policy may take over now

    @kopf.daemon(*policies, registry=registry, cancellation_timeout=5.0, id="policy_worked_on")
    async def policy_worked_on(name: str, stopped: kopf.DaemonStopped, **_: Any) -> None:
        worker.start_working(name)
        try:
            await stopped.wait()
        finally:
            worker.stop_working(name)
