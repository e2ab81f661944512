"""What the monitor takes from the pods on its node (pure): their names, and which containers
will not run again.

A container's region folder stays until its pod is deleted (the plugin's cleanup), so a scan
also finds the regions of init containers that completed and of containers that exited. They
hold no GPU memory any more, and summed into the per-GPU figures they would show a GPU more
handed out than it is: a pod with a 4 GiB init container and a 4 GiB main container showed
8 GiB of caps on a GPU on which it can only ever use 4 at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vgpu_deviceplugin.allocate import ENDED_PHASES  # every container of the pod has stopped


@dataclass(frozen=True)
class PodView:
    """names: pod uid -> (namespace, name); finished: (pod uid, container) of the containers that
    will not run again (`ended_containers`). Empty without the API: every region is counted then."""

    names: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    finished: frozenset[tuple[str, str]] = frozenset()

    @classmethod
    def of(cls, pods: Iterable[Mapping[str, Any]]) -> PodView:
        names: dict[str, tuple[str, str]] = {}
        finished: set[tuple[str, str]] = set()
        for pod in pods:
            meta = pod.get("metadata") or {}
            uid = meta.get("uid")
            if not uid:
                continue
            names[uid] = (meta.get("namespace", ""), meta.get("name", ""))
            finished.update((uid, name) for name in ended_containers(pod))
        return cls(names, frozenset(finished))


def ended_containers(pod: Mapping[str, Any]) -> list[str]:
    """The pod's containers, init containers included, that will not run again: every one of a
    pod that has ended; an init container that exited 0 (not a sidecar, which restarts); a
    container that exited where the pod's restartPolicy does not start it again (Never, or
    OnFailure after exit 0). A terminated container that restarts (CrashLoopBackOff between two
    runs, a failed init container tried again) is not: its next run uses its cap again. The
    exporter also counts any container that still has live processes (a Failed pod's
    containers during their grace period)."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    if status.get("phase") in ENDED_PHASES:
        return [c.get("name", "") for key in ("initContainers", "containers")
                for c in spec.get(key) or []]
    sidecars = {c.get("name") for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"}
    policy = spec.get("restartPolicy") or "Always"
    ended = []
    for key in ("initContainerStatuses", "containerStatuses"):
        for s in status.get(key) or []:
            terminated = (s.get("state") or {}).get("terminated")
            if terminated is None:
                continue
            succeeded = terminated.get("exitCode") == 0
            if key == "initContainerStatuses":
                done = succeeded and s.get("name") not in sidecars
            else:
                done = policy == "Never" or (policy == "OnFailure" and succeeded)
            if done:
                ended.append(s.get("name", ""))
    return ended
