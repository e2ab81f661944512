"""This node's pods, kept current by a watch (field selector spec.nodeName), for Allocate.

A fresh list per Allocate costs what the API server pays to filter every pod in the cluster; the
cache makes the lookup cost follow the pods on this node only. Reads that might be stale are made
safe by the caller: consuming `devices-to-allocate` is a compare-and-swap, and a miss or a failed
swap falls back to a fresh list.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from vgpu_deviceplugin.kube import KubeClient

log = logging.getLogger(__name__)

# Deleted pods remembered between two Allocates (a node that churns pods and allocates none).
MAX_DELETED = 4096


class PodCache:
    def __init__(self) -> None:
        self._pods: dict[str, dict[str, Any]] = {}
        self._deleted: set[str] = set()
        self.synced = False

    def pods(self) -> list[dict[str, Any]] | None:
        """The cached pods, or None until the first list has arrived."""
        return list(self._pods.values()) if self.synced else None

    def put(self, pod: dict[str, Any]) -> None:
        """Record an object the plugin itself just wrote (newer than what the watch has said)."""
        uid = pod.get("metadata", {}).get("uid")
        if uid and uid in self._pods:
            self._pods[uid] = pod

    def deleted(self) -> set[str]:
        """The uids of pods deleted since the last call (what the plugin keeps of them can go)."""
        gone, self._deleted = self._deleted, set()
        return gone

    def apply(self, kind: str, pod: dict[str, Any]) -> None:
        if kind == "RESET":
            self._pods.clear()
            self.synced = False
        elif kind == "SYNCED":
            self.synced = True
        elif kind == "DELETED":
            uid = pod.get("metadata", {}).get("uid", "")
            self._pods.pop(uid, None)
            if len(self._deleted) < MAX_DELETED:  # past it, the next fresh list prunes instead
                self._deleted.add(uid)
        elif kind in ("ADDED", "MODIFIED"):
            self._pods[pod.get("metadata", {}).get("uid", "")] = pod

    async def follow(self, kube: KubeClient, node: str, stop: asyncio.Event) -> None:
        async for kind, pod in kube.pod_events(node):
            self.apply(kind, pod)
            if stop.is_set():
                return
