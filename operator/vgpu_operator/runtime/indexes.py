"""What the operator keeps in memory between reconciles: the VGPUPolicies it has seen (which one
is active) and the Nodes, trimmed to what rendering and status read. Fed by the kopf handlers and
the node follower; read by the reconciler."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from vgpu_formats import annotations as node_annotations

NODE_KEYS = (node_annotations.NODE_REGISTER,)  # the only node annotation rendering and status read


def _version(obj: Mapping[str, Any]) -> int:
    value = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(value) if value.isdigit() else -1


class PolicyIndex:
    """The VGPUPolicies the operator has seen, newest state of each; the oldest one is active."""

    def __init__(self) -> None:
        self.bodies: dict[str, dict[str, Any]] = {}

    def update(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        name = str((body.get("metadata") or {}).get("name", ""))
        if deleted:
            self.bodies.pop(name, None)
            return
        known = self.bodies.get(name)
        # Our own status write returns a newer object than a watch event still in flight.
        if known is None or _version(body) >= _version(known) or _version(body) < 0:
            self.bodies[name] = dict(body)

    def active(self, *, including_deleted: bool = False) -> str | None:
        """Oldest by creationTimestamp, then name; policies being deleted step aside (unless
        `including_deleted`: was this one in charge before its deletion?)."""
        alive = [(str(b["metadata"].get("creationTimestamp") or ""), name) for name, b in self.bodies.items()
                 if including_deleted or not b["metadata"].get("deletionTimestamp")]
        return min(alive)[1] if alive else None


class NodeIndex:
    """Nodes, trimmed to what rendering and status read; tells whether a change matters."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.versions: dict[str, int] = {}
        self.seeded = asyncio.Event()  # set once a full list was read: safe to render node-config

    @staticmethod
    def trim(body: Mapping[str, Any]) -> dict[str, Any]:
        meta = body.get("metadata") or {}
        status = body.get("status") or {}
        kept = {key: value for key, value in (meta.get("annotations") or {}).items() if key in NODE_KEYS}
        return {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": meta.get("name"), "labels": dict(meta.get("labels") or {}),
                         "annotations": kept},
            "status": {"allocatable": dict(status.get("allocatable") or {})},
        }

    def update(self, body: Mapping[str, Any], deleted: bool = False) -> bool:
        """Record a node event; True when labels, registration or allocatable changed."""
        name = str((body.get("metadata") or {}).get("name", ""))
        version = _version(body)
        if 0 <= version < self.versions.get(name, -1):
            return False  # an older state than the one already indexed (the list raced the watch)
        if deleted:  # the last event of this node: the stream is ordered, nothing older follows
            self.versions.pop(name, None)
            return self.nodes.pop(name, None) is not None
        self.versions[name] = version
        trimmed = self.trim(body)
        if self.nodes.get(name) == trimmed:
            return False
        self.nodes[name] = trimmed
        return True

    def all(self) -> list[dict[str, Any]]:
        return [self.nodes[name] for name in sorted(self.nodes)]
