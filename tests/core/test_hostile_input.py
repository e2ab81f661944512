"""Texts built to hurt (or merely unusual): the operator's core reads them as Volcano and the device
plugin do, refuses what cannot be read within bounds with the line and the fix, and never raises,
hangs, or loses what it does not own."""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import pytest
import yaml
from vgpu_formats import node_config as nc
from vgpu_formats import yamlio
from vgpu_formats.errors import FormatError
from vgpu_operator.api import parse_spec
from vgpu_operator.decide import render_all
from vgpu_operator.validate import errors, validate
from vgpuctl.main import main

from tests.core.support import observe

CONF = "volcano-scheduler-configmap"
DEVICE_CONFIG = "volcano-vgpu-device-config"
# 327 bytes: each line repeats the one before nine times (9^8 = 43 million strings when walked).
ALIAS_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefg", "bcdefgh", strict=True))
DEEP = "x: " + "[" * 5000 + "]" * 5000 + "\n"  # 10 KB


def _docs_with(docs: list[dict[str, Any]], name: str, key: str, text: str) -> list[dict[str, Any]]:
    docs = copy.deepcopy(docs)
    next(d for d in docs if d["metadata"]["name"] == name)["data"][key] = text
    return docs


def _conf_text(docs: list[dict[str, Any]]) -> str:
    return str(next(d for d in docs if d["metadata"]["name"] == CONF)["data"]["volcano-scheduler.conf"])


def _run(docs: list[dict[str, Any]], spec_dict: dict[str, Any] | None = None) -> tuple[Any, list[Any]]:
    spec = parse_spec(spec_dict or {})
    observed = observe(docs, spec)
    result = render_all(spec, observed)
    return result, validate(spec, observed, result)


def _target(result: Any, name: str) -> Any:
    return next(t for t in result.targets if t.name == name)


def _written(docs: list[dict[str, Any]], name: str, key: str, text: str) -> str:
    """What the operator writes to `key` of ConfigMap `name` when it holds `text`."""
    result, problems = _run(_docs_with(docs, name, key, text))
    assert not errors(problems)
    return str(_target(result, name).desired["data"][key])


@pytest.mark.parametrize("key", ["on", "1", "yes", "~"])
def test_non_string_keys_are_read_as_go_reads_them(cluster_docs: list[dict[str, Any]], key: str) -> None:
    conf = _conf_text(cluster_docs) + f"{key}: kept\n"
    docs = _docs_with(cluster_docs, CONF, "volcano-scheduler.conf", conf)
    device = next(d for d in docs if d["metadata"]["name"] == DEVICE_CONFIG)
    device["data"]["device-config.yaml"] = device["data"]["device-config.yaml"].replace(
        "nvidia:\n", f"nvidia:\n  {key}: 1\n")
    result, problems = _run(docs)
    assert not errors(problems)
    written = yamlio.load(_target(result, CONF).desired["data"]["volcano-scheduler.conf"])
    go_key = "" if key == "~" else key
    assert written[go_key] == "kept"  # the same key for Volcano, with deviceshare added beside it
    assert any(p.get("name") == "deviceshare" for t in written["tiers"] for p in t["plugins"])
    assert yamlio.load("on: 1\n1: 2\n~: 3\n") == {"on": 1, "1": 2, "": 3}


@pytest.mark.parametrize(("name", "key", "text", "said"), [
    (CONF, "volcano-scheduler.conf", DEEP, "nested deeper than 64 levels at line 1"),
    (CONF, "volcano-scheduler.conf", ALIAS_BOMB + "tiers: []\n", "aliases expand to more than"),
    (CONF, "volcano-scheduler.conf", "tiers: []\n? [a, b]\n: c\n",
     "the key at line 2, column 3 is a sequence"),
    (DEVICE_CONFIG, "device-config.yaml", "nvidia:\n  x: " + "[" * 5000 + "]" * 5000, "nested deeper"),
    (DEVICE_CONFIG, "device-config.yaml", ALIAS_BOMB, "aliases expand"),
])
def test_hostile_texts_are_refused_quickly_with_the_reason(cluster_docs: list[dict[str, Any]], name: str,
                                                            key: str, text: str, said: str) -> None:
    docs = _docs_with(cluster_docs, name, key, text)
    started = time.monotonic()
    result, problems = _run(docs)
    elapsed = time.monotonic() - started
    failed = _target(result, name)
    assert failed.error is not None and failed.desired is None  # nothing of it is rewritten
    assert said in failed.error.message and failed.error in errors(problems)
    assert elapsed < 5, f"took {elapsed:.1f} s"  # was 38 s (bomb) or RecursionError (depth)


def test_a_million_levels_do_not_crash_the_process() -> None:
    # libyaml's composer recurses in C: this text, composed, kills the interpreter (SIGSEGV).
    text = "x: " + "[" * 500_000 + "]" * 500_000
    with pytest.raises(yamlio.RefusedText, match="nested deeper"):
        yamlio.load(text)
    with pytest.raises(yamlio.RefusedText, match="bytes, more than"):
        yamlio.load("x: " + "y" * (1 << 20))


def test_deep_node_config_is_a_format_error_not_a_crash() -> None:
    with pytest.raises(FormatError, match=r"config\.json: nested deeper than 64 levels"):
        nc.parse_node_config('{"nodeconfig": ' + "[" * 5000 + "]" * 5000 + "}")
    with pytest.raises(FormatError, match=r"config\.json: nested deeper"):
        nc.parse_node_config('{"nodeconfig": [{"name": "n", "x": ' + "[" * 100 + "]" * 100 + "}]}")


def test_two_deviceshare_entries_block_writes_and_doctor_agrees(cluster_docs: list[dict[str, Any]],
                                                               tmp_path: Any, capsys: Any) -> None:
    conf = yamlio.load(_conf_text(cluster_docs))
    for tier, enabled in ((conf["tiers"][0], False), (conf["tiers"][-1], True)):
        tier["plugins"].append({"name": "deviceshare", "arguments": {"deviceshare.VGPUEnable": enabled}})
    docs = _docs_with(cluster_docs, CONF, "volcano-scheduler.conf", yaml.safe_dump(conf))
    result, problems = _run(docs)
    assert [p.reason for p in errors(problems)] == ["DeviceShareDuplicated"]
    message = errors(problems)[0].message
    assert "deviceshare is listed 2 times (tiers[0].plugins[" in message and "Keep one" in message
    assert _target(result, CONF).desired is None  # and, an error, it blocks every other write
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump_all(docs))
    assert main(["doctor", "-c", str(tmp_path), "--no-color"]) != 0
    assert "deviceshare is listed 2 times" in capsys.readouterr().out


def test_a_rewrite_keeps_comments_anchors_and_quoting(cluster_docs: list[dict[str, Any]]) -> None:
    conf = ('# edited by the platform team, ticket 4711\n'
            'actions: "enqueue, allocate, backfill"\n'
            'tiers:\n'
            '  - plugins:\n'
            '      - name: priority  # keep first\n'
            '      - name: gang\n'
            '        arguments: &shared\n'
            '          gang.timeout: 30\n'
            '  - plugins:\n'
            '      - name: predicates\n'
            '      - name: proportion\n'
            '        arguments: *shared\n')
    text = _written(cluster_docs, CONF, "volcano-scheduler.conf", conf)
    assert text.startswith('# edited by the platform team, ticket 4711\n'
                           'actions: "enqueue, allocate, backfill"')
    assert "- name: priority  # keep first" in text
    assert "arguments: &shared" in text and "arguments: *shared" in text
    assert "      - name: deviceshare\n" in text  # inserted before predicates, in the writer's indentation
    plugins = [p["name"] for t in yamlio.load(text)["tiers"] for p in t["plugins"]]
    assert plugins == ["priority", "gang", "deviceshare", "predicates", "proportion"]


def test_device_config_rewrite_keeps_comments_and_foreign_sections(
        cluster_docs: list[dict[str, Any]]) -> None:
    text = ("# owned by the GPU team\n"
            "nvidia:\n"
            "  resourceCountName: volcano.sh/vgpu-number  # the scheduler's name\n"
            "  deviceSplitCount: 4\n"
            "vnpus: &npu\n"
            "  - chipName: 910B\n"
            "mirror: *npu\n")
    written = _written(cluster_docs, DEVICE_CONFIG, "device-config.yaml", text)
    assert written.startswith("# owned by the GPU team\nnvidia:\n")
    assert "resourceCountName: volcano.sh/vgpu-number  # the scheduler's name" in written
    assert "vnpus: &npu" in written and "mirror: *npu" in written
    assert yamlio.load(written)["nvidia"]["deviceSplitCount"] == 10


def test_node_config_keeps_keys_upstream_does_not_know(cluster_docs: list[dict[str, Any]]) -> None:
    spec = {"nodeOverrides": [{"nodeNames": ["test-app-64-46-msxf"], "deviceSplitCount": 4}]}
    live = {"nodeconfig": [{"name": "test-app-64-46-msxf", "devicesplitcount": 2, "hami.io/extra": [1]},
                           {"name": "gone", "devicesplitcount": 3}],
            "version": "hami-2"}
    docs = copy.deepcopy(cluster_docs)
    docs.append({"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": nc.CONFIGMAP_NAME, "namespace": "kube-system"},
                 "data": {nc.CONFIGMAP_KEY: json.dumps(live)}})
    result, _ = _run(docs, spec)
    written = json.loads(_target(result, nc.CONFIGMAP_NAME).desired["data"][nc.CONFIGMAP_KEY])
    assert written == {"nodeconfig": [{"name": "test-app-64-46-msxf", "devicesplitcount": 4,
                                       "hami.io/extra": [1]}], "version": "hami-2"}


def test_empty_or_malformed_node_names_are_refused() -> None:
    for names in ([""], ["Node_1"], ["a" * 254]):
        with pytest.raises(ValueError, match=r"nodeNames\[0\] .* is not a node name"):
            parse_spec({"nodeOverrides": [{"nodeNames": names, "deviceSplitCount": 2}]})


def test_exponent_numbers_and_complex_keys_in_a_policy_file(tmp_path: Any, capsys: Any) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("apiVersion: vgpu.io/v1alpha1\nkind: VGPUPolicy\nmetadata: {name: p}\nspec:\n"
                      "  nodeOverrides:\n  - nodeNames: [n1]\n    deviceMemoryScaling: 1e-3\n")
    assert main(["render", "-f", str(policy), "-o", "json"]) == 0  # a number, as the API server reads it
    capsys.readouterr()
    policy.write_text("apiVersion: vgpu.io/v1alpha1\nkind: VGPUPolicy\nmetadata: {name: p}\n? [a]\n: b\n")
    assert main(["render", "-f", str(policy)]) != 0
    err = capsys.readouterr().err
    assert "the key at line 4, column 3 is a sequence" in err and "not valid YAML" not in err


def test_an_alias_bomb_policy_file_is_refused_at_once(tmp_path: Any, capsys: Any) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("apiVersion: vgpu.io/v1alpha1\nkind: VGPUPolicy\nmetadata: {name: p}\n" + ALIAS_BOMB)
    started = time.monotonic()
    assert main(["render", "-f", str(policy)]) != 0
    assert time.monotonic() - started < 5  # was 34 s
    assert "aliases expand to more than" in capsys.readouterr().err
