"""Injected faults beyond an error status: a dropped connection, a request that hangs, a fault
that lets the first matching requests through. A faulted request never changes anything."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from vgpu_emulator import RunningEmulator

from tests.support.api import Api

CMS = "/api/v1/namespaces/default/configmaps"


def _cm(name: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}


async def test_a_dropped_request_gets_no_answer_and_changes_nothing(api: Api,
                                                                    running: RunningEmulator) -> None:
    await api.call("POST", CMS, _cm("a"))
    running.emulator.fail_next("PATCH", r"/configmaps/a$", action="drop")
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await api.call("PATCH", CMS + "/a", {"data": {"k": "dropped"}})
    assert (await api.call("GET", CMS + "/a"))[1]["data"] == {"k": "v"}
    assert running.emulator.writes("/configmaps/a") == [], "logged as served, not as a write"
    assert (await api.call("PATCH", CMS + "/a", {"data": {"k": "w"}}))[0] == 200, "only the next one"


async def test_a_hung_request_waits_until_released_and_is_then_dropped(api: Api,
                                                                    running: RunningEmulator) -> None:
    await api.call("POST", CMS, _cm("a"))
    fault = running.emulator.fail_next("PATCH", r"/configmaps/a$", action="hang", times=10)
    hung = asyncio.create_task(api.call("PATCH", CMS + "/a", {"data": {"k": "hung"}}))
    await asyncio.sleep(0.2)
    assert not hung.done(), "no answer while the fault lasts"
    fault.release()
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await hung
    assert (await api.call("GET", CMS + "/a"))[1]["data"] == {"k": "v"}
    assert (await api.call("PATCH", CMS + "/a", {"data": {"k": "w"}}))[0] == 200, "released: no more faults"


async def test_a_fault_can_let_the_first_requests_through(api: Api, running: RunningEmulator) -> None:
    running.emulator.fail_next("POST", r"/configmaps$", status=500, after=1)
    assert [(await api.call("POST", CMS, _cm(name)))[0] for name in "abc"] == [201, 500, 201]


async def test_objects_can_be_deleted_in_process(api: Api, running: RunningEmulator) -> None:
    await api.call("POST", CMS, _cm("a"))
    running.emulator.delete_object("ConfigMap", "default", "a")
    assert (await api.call("GET", CMS + "/a"))[0] == 404
