"""Properties over random clusters: rendering is idempotent and never drops what is not ours."""

from __future__ import annotations

import copy
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vgpu_operator.api import parse_spec
from vgpu_operator.decide import render_all
from vgpu_operator.render.device_plugin import LEGACY_FLAGS
from vgpu_operator.render.scheduler_conf import OWNED_ARGUMENTS

from tests.core.conftest import FIXTURES, load_docs
from tests.core.support import apply, observe, workload

BASE = load_docs(*sorted((FIXTURES / "cluster").glob("*.yaml")))
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=8).filter(
    lambda w: w[0] != "-")
scalars = st.one_of(st.integers(-5, 10**6), st.booleans(), words,
                    st.floats(allow_nan=False, allow_infinity=False, width=32))
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(words, scalars, max_size=2))
foreign_args = st.dictionaries(words.map(lambda w: f"x.{w}"), values, max_size=3)
foreign_plugin = st.builds(lambda name, args, switch: {
    "name": f"p-{name}", **({"arguments": args} if args else {}), **switch},
    words, foreign_args, st.sampled_from([{}, {"enablePreemptable": False}, {"enableJobOrder": True}]))


@st.composite
def scheduler_confs(draw: st.DrawFn) -> dict[str, Any]:
    tiers = draw(st.lists(st.lists(foreign_plugin, max_size=4), min_size=1, max_size=3))
    conf: dict[str, Any] = {"actions": "enqueue, allocate, backfill",
                            "tiers": [{"plugins": plugins} for plugins in tiers]}
    if draw(st.booleans()):
        tier = draw(st.integers(0, len(tiers) - 1))
        conf["tiers"][tier]["plugins"].insert(draw(st.integers(0, len(tiers[tier]))), {"name": "predicates"})
    if draw(st.booleans()):
        ours = draw(st.dictionaries(st.sampled_from(OWNED_ARGUMENTS), scalars, max_size=3))
        tier = draw(st.integers(0, len(tiers) - 1))
        conf["tiers"][tier]["plugins"].append(
            {"name": "deviceshare", "arguments": {**draw(foreign_args), **ours}})
    if draw(st.booleans()):
        conf["configurations"] = [{"name": "enqueue", "arguments": draw(foreign_args)}]
    if draw(st.booleans()):
        conf["metrics"] = {"address": "http://prometheus:9090"}
    return conf


@st.composite
def plugin_args(draw: st.DrawFn) -> tuple[list[str], list[str]]:
    """(args, the foreign tokens among them in order)."""
    args: list[str] = []
    foreign: list[str] = []
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.booleans()):
            name = draw(st.sampled_from(LEGACY_FLAGS))
            value = draw(words)
            args += draw(st.sampled_from([[f"--{name}={value}"], [f"--{name}", value]]))
        else:
            name = draw(words)
            item = draw(st.sampled_from([[f"--x-{name}"], [f"--x-{name}=1"], [f"-x{name}"], [name]]))
            args += item
            foreign += item
    return args, foreign


def _cluster(conf: dict[str, Any], args: list[str], image: str) -> list[dict[str, Any]]:
    docs = copy.deepcopy(BASE)
    cm = next(d for d in docs if d["metadata"]["name"] == "volcano-scheduler-configmap")
    cm["data"]["volcano-scheduler.conf"] = yaml.safe_dump(conf, sort_keys=False)
    container = workload(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    container["args"], container["image"] = args, image
    return docs


images = st.sampled_from(["projecthami/volcano-vgpu-device-plugin:v1.11.0",
                          "projecthami/volcano-vgpu-device-plugin:v1.12.0", "acme/vgpu-device-plugin:1"])
specs = st.fixed_dictionaries({}, optional={
    "device": st.fixed_dictionaries({"deviceSplitCount": st.integers(1, 100),
                                     "gpuMemoryFactor": st.integers(1, 64)}),
    "scheduler": st.fixed_dictionaries({"schedulePolicy": st.sampled_from(["binpack", "spread", "unset"]),
                                        "scheduleWeight": st.integers(0, 100)}),
    "nodeOverrides": st.just([{"nodeSelector": {"matchLabels": {"gpu": "on"}}, "deviceSplitCount": 3}]),
})


@SETTINGS
@given(conf=scheduler_confs(), args=plugin_args(), image=images, spec_dict=specs)
def test_render_is_idempotent(conf: dict[str, Any], args: tuple[list[str], list[str]], image: str,
                              spec_dict: dict[str, Any]) -> None:
    spec = parse_spec(spec_dict)
    docs = _cluster(conf, args[0], image)
    first = render_all(spec, observe(docs, spec))
    assert not first.problems
    second = render_all(spec, observe(apply(docs, first), spec))
    assert [t.ref for t in second.changed] == []
    assert [t.content_hash for t in second.targets] == [t.content_hash for t in first.targets]


def _plugins(conf: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for tier in conf["tiers"] for p in tier["plugins"]]


@SETTINGS
@given(conf=scheduler_confs(), args=plugin_args(), image=images)
def test_foreign_config_survives(conf: dict[str, Any], args: tuple[list[str], list[str]], image: str) -> None:
    spec = parse_spec({})
    docs = _cluster(conf, args[0], image)
    result = render_all(spec, observe(docs, spec))
    text = result.target("ConfigMap", "volcano-scheduler-configmap").text
    after = yaml.safe_load(text or "")
    before = yaml.safe_load(yaml.safe_dump(conf, sort_keys=False))  # what the live text meant
    # every top-level key but tiers, every tier, every foreign plugin in order, byte-equal values
    assert after.keys() == before.keys()
    assert all(after[k] == before[k] for k in before if k != "tiers")
    assert len(after["tiers"]) == len(before["tiers"])
    foreign_before = [p for p in _plugins(before) if p["name"] != "deviceshare"]
    # compared as YAML text, so 1, 1.0 and true stay distinct (no int turned into a string or float)
    assert yaml.safe_dump([p for p in _plugins(after) if p["name"] != "deviceshare"]) == \
        yaml.safe_dump(foreign_before)
    for old, new in zip(before["tiers"], after["tiers"], strict=True):
        assert [p for p in new["plugins"] if p["name"] != "deviceshare"] == \
            [p for p in old["plugins"] if p["name"] != "deviceshare"]
    share_before = next((p for p in _plugins(before) if p["name"] == "deviceshare"), {"arguments": {}})
    share_after = next(p for p in _plugins(after) if p["name"] == "deviceshare")
    for key, value in share_before["arguments"].items():
        if key.startswith("x."):
            assert share_after["arguments"][key] == value
            assert type(share_after["arguments"][key]) is type(value)
    # the DaemonSet keeps every foreign token, in order; v1.12 only those that are not flags it
    # lacks (it would exit on them)
    desired = result.target("DaemonSet", "volcano-device-plugin").desired
    assert desired is not None
    new_args = desired["spec"]["template"]["spec"]["containers"][0].get("args", [])
    if image.endswith(":v1.12.0"):
        assert not [a for a in new_args if a.startswith("-")]
        rest = iter(args[1])
        assert all(token in rest for token in new_args)  # a subsequence, in order
    else:
        assert _without_ours(new_args) == args[1]


def _without_ours(args: list[str]) -> list[str]:
    """`args` minus our flags and their values (either form)."""
    kept: list[str] = []
    tokens = iter(args)
    for token in tokens:
        name, eq, _ = token.lstrip("-").partition("=")
        if token.startswith("--") and name in LEGACY_FLAGS:
            if not eq:
                next(tokens, None)
            continue
        kept.append(token)
    return kept
