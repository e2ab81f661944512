"""kopf handlers: thin. Each one records what it saw and hands the work to the Reconciler.

* VGPUPolicy create/update/resume -> reconcile that policy now (kopf retries on failure)
* VGPUPolicy events               -> keep the policy index (which one is active, latest state)
* VGPUPolicy delete               -> leave the cluster working: remove our ownership labels only
* VGPUPolicy daemon               -> mark the policy "worked on by this replica" while it runs:
                                     kopf stops daemons when peering pauses a replica, so this is
                                     how the Reconciler's own worker (outside kopf) pauses too
(Nodes are followed by `vgpu_operator.nodes`, and the policy's ConfigMaps, Deployment and
DaemonSet by `vgpu_operator.targets`, not kopf: see there why.)

The periodic safety resync is the Reconciler's worker (one loop, for the active policy), not a
kopf timer per policy: a timer would duplicate it, and kopf holds a deleted policy's finalizer
until its timer has exited.

Handlers are registered on a fresh registry per operator run (`register`), bound to one
Reconciler: no module-level state, so tests can run operators one after another in one process.
"""

from __future__ import annotations

from typing import Any

import kopf

from vgpu_operator import api
from vgpu_operator.reconcile import Reconciler


def register(registry: kopf.OperatorRegistry, reconciler: Reconciler) -> None:
    """Register every handler of the operator on `registry`."""
    policies = (api.GROUP, api.VERSION, api.PLURAL)
    # Explicit ids: kopf's default is the qualified name, so its lines would read
    # "Handler 'register.<locals>.policy_changed' succeeded".

    @kopf.on.event(*policies, registry=registry, id="policy_seen")
    async def policy_seen(type: str | None, body: kopf.Body, **_: Any) -> None:
        deleted = type == "DELETED"
        before = reconciler.policies.active()
        reconciler.policies.update(body, deleted=deleted)
        if reconciler.policies.active() != before:
            reconciler.trigger()  # another policy became active (the old one left or stepped aside)

    @kopf.on.resume(*policies, registry=registry, backoff=0.2, id="policy_changed")
    @kopf.on.create(*policies, registry=registry, backoff=0.2, id="policy_changed")
    @kopf.on.update(*policies, registry=registry, backoff=0.2, field="spec", id="policy_changed")
    async def policy_changed(name: str, body: kopf.Body, **_: Any) -> None:
        reconciler.policies.update(body)
        if not await reconciler.reconcile(name):
            raise kopf.TemporaryError("reconcile failed; see the status and events", delay=0.2)

    @kopf.on.delete(*policies, registry=registry, backoff=0.2, id="policy_deleted")
    async def policy_deleted(name: str, body: kopf.Body, **_: Any) -> None:
        reconciler.policies.update(body)
        if reconciler.policies.active(including_deleted=True) != name:
            reconciler.policies.update(body, deleted=True)
            return  # a conflicting policy never wrote anything
        await reconciler.release(name, dict(body))

    @kopf.daemon(*policies, registry=registry, cancellation_timeout=5.0, id="policy_worked_on")
    async def policy_worked_on(name: str, stopped: kopf.DaemonStopped, **_: Any) -> None:
        reconciler.start_working(name)
        try:
            await stopped.wait()
        finally:
            reconciler.stop_working(name)
