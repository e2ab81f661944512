"""The one list-then-watch loop for what the operator follows itself (Nodes, a policy's targets):
list, watch from the list's version, list again when the version expired (410) or the stream
failed in a way a retry cannot mend; back off after each failure, never give up unless told.

A stream that ends in an ERROR event, or at once without a single event, is a failure too: a
server (or proxy) answering every watch that way must not get a list and a watch per loop turn."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from vgpu_formats.kubeapi import ApiException

from vgpu_operator.k8s import Kube, is_transient

logger = logging.getLogger(__name__)

BACKOFF_SECONDS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)  # after the 1st, 2nd, ... failure in a row
QUICK_END_SECONDS = 1.0  # a stream that ends sooner with no event did not really watch


def backoff_delay(failures: int, backoff: tuple[float, ...] = BACKOFF_SECONDS) -> float:
    """The wait after `failures` (>= 1) failures in a row."""
    return backoff[min(failures, len(backoff)) - 1]


def _never(exc: Exception) -> bool:
    return False


async def list_and_watch(kube: Kube, kind: str, what: str, relist: Callable[[], Awaitable[str]],
                         on_event: Callable[[str, dict[str, Any]], None], backoff: tuple[float, ...], *,
                         namespace: str | None = None, fields: str = "", stop: asyncio.Event | None = None,
                         give_up: Callable[[Exception], bool] = _never) -> None:
    """Follow `kind` until `stop` is set (or cancelled). `relist()` reads the current state and
    returns the version to watch from; `on_event(type, object)` gets every change (bookmarks and
    the 410 ERROR event stay here). `give_up(exc)`: a failure that ends the loop for good."""
    failures = 0
    version = ""  # where the watch resumes; "" = list first
    loop = asyncio.get_running_loop()
    while stop is None or not stop.is_set():
        try:
            if not version:
                version = await relist()
            started, delivered, error = loop.time(), False, None
            async with contextlib.aclosing(  # type: ignore[type-var]
                    kube.watch(kind, version, namespace=namespace, fields=fields)) as events:
                async for event in events:
                    type_, obj = event.get("type"), event.get("object") or {}
                    if type_ == "ERROR":  # 410 Gone (our version is too old), or a server error
                        version, error = "", obj.get("message") or obj.get("code") or "no detail"
                        break
                    delivered = True
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if type_ != "BOOKMARK":
                        on_event(str(type_), obj)
            if error is None and (delivered or loop.time() - started >= QUICK_END_SECONDS):
                failures = 0
                continue
            failures += 1
            logger.debug("watching %s: %s", what, f"ERROR event ({error}); listing again"
                         if error is not None else "the stream ended at once; watching again")
            await asyncio.sleep(backoff_delay(failures, backoff))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if give_up(exc):
                return
            if isinstance(exc, ApiException) and exc.status == 410:
                version = ""  # expired: list again
            elif not is_transient(exc):
                logger.warning("watching %s failed (%s); listing again", what, exc)
                version = ""
            failures += 1
            await asyncio.sleep(backoff_delay(failures, backoff))
