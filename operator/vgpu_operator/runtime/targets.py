"""Follow the objects the active policy names (its ConfigMaps, the scheduler Deployment, the
plugin DaemonSet): one list + watch per object, selected by `metadata.name`. Any change to one of
them triggers a reconcile, so a hand edit is repaired at once rather than at the next resync.

Why not a kopf handler: kopf lists and watches a kind in a whole namespace, and Kubernetes RBAC
cannot limit such a request by name, so the operator would need read access to every ConfigMap
of kube-system. A request with the `metadata.name=X` field selector is authorized as a request
for X, so the chart grants get/list/watch on the named objects only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import pydantic
from vgpu_formats.kubeapi import ApiException

from vgpu_operator import api
from vgpu_operator.k8s import Kube
from vgpu_operator.registry import Key, wanted_objects
from vgpu_operator.runtime.indexes import PolicyIndex
from vgpu_operator.runtime.watching import BACKOFF_SECONDS, list_and_watch

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.5  # how soon a policy that names other objects gets its new watches
# A watch the RBAC refused is tried again this much later: a grant may come after the operator
# started (a RoleBinding applied later), and until it is retried, a hand edit of that object is
# repaired only at the next resync.
FORBIDDEN_RETRY_SECONDS = 60.0
_said_forbidden: set[Key] = set()  # a refusal is said at info once per object, then at debug


def targets_of(body: dict[str, Any] | None) -> frozenset[Key]:
    """The objects a policy renders or reads (none for no policy or an invalid one)."""
    if body is None:
        return frozenset()
    try:
        spec = api.VGPUPolicy.from_api(body)[0].spec
    except pydantic.ValidationError:
        return frozenset()
    return frozenset(w.key for w in wanted_objects(spec))


async def watch_one(kube: Kube, key: Key, trigger: Callable[[], None],
                    backoff: tuple[float, ...] = BACKOFF_SECONDS) -> None:
    """List + watch one object by name until cancelled; trigger on every change (a relist after
    a dropped or expired watch triggers when the object changed meanwhile)."""
    kind, namespace, name = key
    fields = f"metadata.name={name}"
    known: str | None = None  # the object's resourceVersion ("" = absent); None = never listed

    async def listed() -> str:
        nonlocal known
        versions: list[str] = []
        items = [obj async for obj in kube.iter_objects(kind, namespace, fields=fields, versions=versions)]
        now = str(items[0]["metadata"].get("resourceVersion") or "") if items else ""
        if known is not None and now != known:
            trigger()
        known = now
        return versions[-1] if versions else ""

    def changed(type_: str, obj: dict[str, Any]) -> None:
        nonlocal known
        known = "" if type_ == "DELETED" else str((obj.get("metadata") or {}).get("resourceVersion") or "")
        trigger()

    def forbidden(exc: Exception) -> bool:
        # An object the RBAC does not name (the optional shadow copy of device-config): the
        # reconcile reads it when it can; `follow` tries again now and then.
        if isinstance(exc, ApiException) and exc.status == 403:
            level = logging.DEBUG if key in _said_forbidden else logging.INFO
            _said_forbidden.add(key)
            logger.log(level, "%s %s/%s: not watchable with this RBAC; not followed (tried again "
                       "later)", kind, namespace, name)
            return True
        return False

    await list_and_watch(kube, kind, f"{kind} {namespace}/{name}", listed, changed, backoff,
                         namespace=namespace, fields=fields, give_up=forbidden)


async def follow(kube: Kube, policies: PolicyIndex, trigger: Callable[[], None], stop: asyncio.Event,
                 poll: float = POLL_SECONDS, backoff: tuple[float, ...] = BACKOFF_SECONDS,
                 retry_forbidden: float = FORBIDDEN_RETRY_SECONDS) -> None:
    """Keep one watch per object of the active policy until `stop` is set; a watch that gave up
    (the RBAC refused it) starts again `retry_forbidden` seconds after it ended."""
    tasks: dict[Key, asyncio.Task[None]] = {}
    ended: dict[Key, float] = {}  # when each watch that gave up ended (loop time)
    body: dict[str, Any] | None = None
    wanted: frozenset[Key] = frozenset()
    loop = asyncio.get_running_loop()
    try:
        while not stop.is_set():
            active = policies.active()
            latest = policies.bodies.get(active) if active is not None else None
            if latest is not body:  # PolicyIndex stores a new dict for every new state: parse it once
                body, wanted = latest, targets_of(latest)
            for key in set(tasks) - wanted:
                tasks.pop(key).cancel()
                ended.pop(key, None)
            for key in [k for k, task in tasks.items() if task.done()]:
                if key not in ended:
                    ended[key] = loop.time()
                    failure = None if tasks[key].cancelled() else tasks[key].exception()
                    if failure is not None:  # a bug: said, and the watch started again as after a 403
                        logger.error("the watch of %s %s/%s failed", *key, exc_info=failure)
                if loop.time() - ended[key] >= retry_forbidden:
                    del tasks[key], ended[key]
            for key in sorted(wanted - set(tasks)):
                tasks[key] = asyncio.create_task(watch_one(kube, key, trigger, backoff),
                                                 name=f"vgpu-operator watch {key[0]} {key[1]}/{key[2]}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), poll)
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
