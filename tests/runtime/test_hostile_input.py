"""The running operator on hostile or unusual ConfigMap texts: it keeps serving, says the truth in
status, and the event loop stays responsive while it reads them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from vgpu_formats import yamlio

from tests.runtime.conftest import Cluster
from tests.support.waiting import eventually

CONF_KEY = "volcano-scheduler.conf"
SCHEDULER = ("ConfigMap", "volcano-system", "volcano-scheduler-configmap")
BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefg", "bcdefgh", strict=True))


def _conf(cluster: Cluster) -> str:
    return cluster.data(SCHEDULER[2], CONF_KEY, namespace=SCHEDULER[1])


def _set_conf(cluster: Cluster, text: str) -> None:
    def change(obj: dict[str, Any]) -> None:
        obj["data"][CONF_KEY] = text
    cluster.edit(*SCHEDULER, change)


async def test_a_yaml_1_1_key_in_the_conf_is_reconciled_not_crashed_on(cluster: Cluster) -> None:
    # `on:` was a bool key: every reconcile raised TypeError while status kept saying Ready.
    _set_conf(cluster, _conf(cluster) + "# the team's switch\non: true\n")
    cluster.create_policy()
    await cluster.ready()
    written = _conf(cluster)
    assert "# the team's switch\non: true" in written  # their line, their comment, untouched
    conf = yamlio.load(written)
    assert conf["on"] is True
    assert any(p.get("name") == "deviceshare" for t in conf["tiers"] for p in t["plugins"])


async def test_a_bomb_in_the_conf_is_refused_and_the_loop_stays_responsive(cluster: Cluster) -> None:
    cluster.create_policy()
    await cluster.ready()
    _set_conf(cluster, BOMB + _conf(cluster))
    lags: list[float] = []

    async def probe() -> None:  # how late a 10 ms sleep wakes up while the operator reads the bomb
        while True:
            started = time.monotonic()
            await asyncio.sleep(0.01)
            lags.append(time.monotonic() - started - 0.01)

    prober = asyncio.create_task(probe())
    try:
        valid = await eventually(lambda: cluster.condition("Valid") if cluster.condition("Valid").get(
            "status") == "False" else None, what="Valid=False")
    finally:
        prober.cancel()
    assert "aliases expand to more than" in valid["message"]
    assert cluster.condition("Ready")["status"] == "False"
    assert max(lags) < 1.0, f"the event loop stalled {max(lags):.1f} s"  # was 38 s of 40
