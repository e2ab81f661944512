"""Following the active policy's objects: one watch per object, by name (so RBAC can name each),
a trigger on every change to one of them and none for their neighbours, watches moved when the
policy names other objects, changes made while a watch was down not lost."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from vgpu_emulator import Emulator, run_emulator
from vgpu_operator.k8s import Kube, new_api_client
from vgpu_operator.runtime import targets
from vgpu_operator.runtime.indexes import PolicyIndex

from tests.support.waiting import eventually

from .conftest import FIXTURES

DEVICE_CONFIG = ("ConfigMap", "kube-system", "volcano-vgpu-device-config")


def _policy(version: int, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": "vgpu.io/v1alpha1", "kind": "VGPUPolicy",
            "metadata": {"name": "default", "creationTimestamp": "2026-01-01T00:00:00Z",
                         "resourceVersion": str(version)},
            "spec": spec or {}}


def _configmap(namespace: str, name: str, value: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace},
            "data": {"k": value}}


@dataclass
class Following:
    emulator: Emulator
    policies: PolicyIndex
    triggers: list[int]

    def reads(self) -> list[str]:
        """Paths and queries of the lists served (a watch is logged only once it ends)."""
        return [f"{s.path}?{s.query}" for s in self.emulator.served if s.method == "GET"]


@asynccontextmanager
async def following(refused: int = 0, retry_forbidden: float = targets.FORBIDDEN_RETRY_SECONDS,
                    ) -> AsyncIterator[Following]:
    """The policy's objects followed; `refused`: the first lists of the device-config answer
    403, as when its RoleBinding comes after the operator started."""
    async with run_emulator(FIXTURES / "cluster") as running:
        running.emulator.apply(_configmap(*DEVICE_CONFIG[1:], "1"))
        if refused:
            running.emulator.fail_next("GET", r"/namespaces/kube-system/configmaps$", status=403,
                                       times=refused)
        kube = Kube(await new_api_client(str(running.kubeconfig)))
        policies, stop, triggers = PolicyIndex(), asyncio.Event(), []
        policies.update(_policy(1))
        follow = targets.follow(kube, policies, lambda: triggers.append(1), stop, poll=0.02,
                                retry_forbidden=retry_forbidden)
        task = asyncio.create_task(follow)
        try:
            state = Following(running.emulator, policies, triggers)
            await eventually(lambda: running.emulator.open_watches() >= 5 - (1 if refused else 0),
                             what="one watch per object of the policy (but a refused one)")
            yield state
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)
            await kube.close()


async def test_one_watch_per_named_object_and_a_trigger_only_for_them() -> None:
    async with following() as state:
        # Every list and watch names its object: what a Role with resourceNames allows.
        assert len(state.reads()) == 5 and all("fieldSelector=metadata.name" in r for r in state.reads())
        assert any("/namespaces/kube-system/configmaps?" in r and "volcano-vgpu-device-config" in r
                   for r in state.reads())
        assert state.emulator.drop_watches() == 5  # a dropped watch is logged: look at its query
        def logged() -> list[str]:
            return [r for r in state.reads() if "watch=true" in r]

        watches = await eventually(lambda: len(logged()) >= 5 and logged(), what="the dropped watches logged")
        assert len(watches) == 5 and all("fieldSelector=metadata.name" in w for w in watches), watches
        await eventually(lambda: state.emulator.open_watches() == 5, what="the watches resumed")
        assert not state.triggers, "listing what is there triggers nothing"
        state.emulator.apply(_configmap("kube-system", "unrelated", "1"))  # a neighbour: no trigger
        state.emulator.apply(_configmap(*DEVICE_CONFIG[1:], "2"))  # a hand edit
        await eventually(lambda: state.triggers, what="a trigger for the edited ConfigMap")
        await asyncio.sleep(0.2)
        assert len(state.triggers) == 1


async def test_a_watch_the_rbac_refused_is_tried_again() -> None:
    # Before, one 403 stopped following that object for the process's life: its hand edits
    # were repaired only at the next resync.
    async with following(refused=1, retry_forbidden=0.3) as state:
        await eventually(lambda: state.emulator.open_watches() == 5, what="the refused watch tried again")
        state.emulator.apply(_configmap(*DEVICE_CONFIG[1:], "2"))  # a hand edit
        await eventually(lambda: state.triggers, what="a trigger for the edited ConfigMap")


async def test_changes_while_the_watch_was_down_are_not_lost() -> None:
    async with following() as state:
        # The resumed watches get 410 (their version expired meanwhile): only the relist, which
        # compares the object's version with the one last seen, can notice the change.
        state.emulator.fail_next("GET", r"/namespaces/kube-system/configmaps$", status=410, times=2)
        assert state.emulator.drop_watches("ConfigMap") > 0
        state.emulator.apply(_configmap(*DEVICE_CONFIG[1:], "2"))  # before any watch resumes
        await eventually(lambda: state.triggers, what="the change seen after the watch dropped")
        await asyncio.sleep(0.2)
        assert len(state.triggers) == 1


async def test_watches_follow_the_policy_to_other_objects() -> None:
    async with following() as state:
        moved = {"targets": {"deviceConfig": {"namespace": "volcano-system"}}}
        state.policies.update(_policy(2, moved))
        await eventually(lambda: any("/namespaces/volcano-system/configmaps?" in r and "device-config" in r
                                     for r in state.reads()), what="a watch on the moved device-config")
        # five objects, and the kube-system copy the upstream plugin would read first (the shadow)
        await eventually(lambda: state.emulator.open_watches() == 6, what="its watch open")
        state.triggers.clear()
        state.emulator.apply(_configmap("volcano-system", "volcano-vgpu-device-config", "1"))
        await eventually(lambda: state.triggers, what="a trigger for the object at its new place")
        state.policies.update(_policy(3), deleted=True)
        await eventually(lambda: state.emulator.open_watches() == 0,
                         what="the watches of a policy that is gone cancelled")
        state.triggers.clear()
        state.emulator.apply(_configmap("volcano-system", "volcano-vgpu-device-config", "2"))
        await asyncio.sleep(0.2)
        assert not state.triggers
