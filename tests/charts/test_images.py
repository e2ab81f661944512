"""Dockerfile facts that can be checked without a Docker engine: pinned bases, a numeric non-root
user, no world-writable files, the Makefile targets the build stages call, and agreement with
what the chart runs (commands, hook files and paths)."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.charts import chart

ROOT = chart.ROOT
DOCKERFILES = {"operator": ROOT / "operator" / "Dockerfile",
               "deviceplugin": ROOT / "deviceplugin" / "Dockerfile"}
PINNED = {
    "python": re.compile(r"^python:3\.11\.\d+-slim-[a-z]+$"),
    "nvidia/cuda": re.compile(r"^nvidia/cuda:\d+\.\d+\.\d+-devel-[a-z]+\d+(\.\d+)?$"),
}


def lines(path: Path) -> list[str]:
    """Instructions with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", path.read_text())
    return [ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def stages(path: Path) -> list[list[str]]:
    out: list[list[str]] = []
    for ln in lines(path):
        if ln.upper().startswith("FROM "):
            out.append([])
        if out:
            out[-1].append(ln)
    return out


def base_images(path: Path) -> list[str]:
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", path.read_text(), re.MULTILINE))
    images = []
    for ln in lines(path):
        if ln.upper().startswith("FROM "):
            ref = ln.split()[1]
            images.append(re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], ref))
    return images


@pytest.mark.parametrize("name", list(DOCKERFILES))
def test_bases_are_pinned_by_exact_tag(name: str) -> None:
    for image in base_images(DOCKERFILES[name]):
        repo = image.split(":")[0]
        assert repo in PINNED, f"{name}: unexpected base {image}"
        assert PINNED[repo].match(image), f"{name}: {image} is not an exact version tag"


@pytest.mark.parametrize("name", list(DOCKERFILES))
def test_final_stage_runs_as_numeric_non_root(name: str) -> None:
    final = stages(DOCKERFILES[name])[-1]
    users = [ln.split()[1] for ln in final if ln.upper().startswith("USER ")]
    assert users, f"{name}: the final stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, users[-1]
    assert not gid or (gid.isdigit() and int(gid) != 0), users[-1]


@pytest.mark.parametrize("name", list(DOCKERFILES))
def test_no_world_writable_files(name: str) -> None:
    text = DOCKERFILES[name].read_text()
    assert not re.search(r"chmod\s+(-R\s+)?(0?777|0?666|[augo]*\+w|o\+)", text)
    final = " ".join(stages(DOCKERFILES[name])[-1])
    assert "find / -xdev -type f -perm -0002" in final, "the build must fail on world-writable files"


def make_targets(dockerfile: Path) -> list[tuple[str, str]]:
    """(directory, target) of each `make` command in a RUN: `make -C hook all` -> ("hook", "all")."""
    calls = []
    for ln in lines(dockerfile):
        if not ln.startswith("RUN "):
            continue
        for command in re.split(r"&&|;|\|\|", ln[4:]):
            words = command.split()
            if not words or words[0] != "make":
                continue
            directory = words[words.index("-C") + 1] if "-C" in words else "."
            targets = [w for i, w in enumerate(words[1:], 1)
                       if not w.startswith("-") and "=" not in w and words[i - 1] not in ("-C", "-o")]
            calls.extend((directory, t) for t in targets or ["all"])
    return calls


@pytest.mark.parametrize("name", list(DOCKERFILES))
def test_build_stages_call_existing_make_targets(name: str) -> None:
    calls = make_targets(DOCKERFILES[name])
    # The package (its gRPC stubs included) is built by pip from what the stage copies.
    copied = " ".join(ln for ln in lines(DOCKERFILES[name]) if ln.startswith("COPY pyproject.toml"))
    assert "setup.py" in copied, f"{name}: the build stage must copy setup.py, which makes the stubs"
    if name == "deviceplugin":
        assert ("hook", "all") in calls
    for directory, target in calls:
        # make -n: resolve the target and print its commands without running them.
        proc = subprocess.run(["make", "-n", "-o", ".venv/.installed", "-C", str(ROOT / directory), target],
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0, f"{name}: make -C {directory} {target}: {proc.stderr}"


def test_entry_points_exist_in_the_package() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "vgpu-operator" in scripts
    entry = [ln for ln in lines(DOCKERFILES["operator"]) if ln.startswith("ENTRYPOINT")]
    assert entry == ['ENTRYPOINT ["vgpu-operator"]']
    assert {"deviceplugin", "vgpu-monitor"} <= set(scripts)


def test_device_plugin_image_holds_what_the_chart_copies(default_objects: list[dict[str, Any]]) -> None:
    text = " ".join(lines(DOCKERFILES["deviceplugin"]))
    assert "/src/hook/build/libvgpu.so /src/hook/build/ld.so.preload /k8s-vgpu/lib/" in text
    # The preload file names the library where install-hook puts it and workloads mount it.
    assert "printf '/usr/local/vgpu/libvgpu.so\\n' > hook/build/ld.so.preload" in text
    spec = next(o for o in default_objects if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    script = " ".join(spec["initContainers"][0]["args"])
    assert "/k8s-vgpu/lib/$f" in script and "/usr/local/vgpu/$f" in script
    commands = {c["command"][0] for c in spec["containers"]}
    assert commands == {"deviceplugin", "vgpu-monitor"}


def test_context_keeps_sources_and_drops_local_state() -> None:
    ignored = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
               if ln.strip() and not ln.startswith("#")]
    for needed in ("pyproject.toml", "README.md", "Makefile", "operator", "deviceplugin", "hook"):
        assert needed not in ignored
    for local in (".venv", ".git", ".tools", "hook/build"):
        assert local in ignored


def test_gpus_are_asked_for_by_the_containers_that_use_them(default_objects: list[dict[str, Any]]) -> None:
    # An image-wide NVIDIA_VISIBLE_DEVICES would make the NVIDIA runtime inject into install-hook too.
    assert "NVIDIA_VISIBLE_DEVICES" not in " ".join(ln for ln in lines(DOCKERFILES["deviceplugin"])
                                                    if ln.startswith("ENV"))
    spec = next(o for o in default_objects if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    wants = {c["name"] for c in spec["initContainers"] + spec["containers"]
             if any(e["name"] == "NVIDIA_VISIBLE_DEVICES" for e in c.get("env", []))}
    assert wants == {"device-plugin", "monitor"}


DIGEST = "sha256:" + "0123456789abcdef" * 4


def images(values: dict[str, Any]) -> dict[str, set[str]]:
    """The image of every container, by workload kind."""
    found: dict[str, set[str]] = {}
    for obj in chart.render(values):
        if obj["kind"] in ("Deployment", "DaemonSet"):
            spec = obj["spec"]["template"]["spec"]
            found[obj["kind"]] = {c["image"] for c in spec.get("initContainers", []) + spec["containers"]}
    return found


@pytest.mark.parametrize(("values", "operator", "plugin"), [
    ({}, "ghcr.io/vgpu-operator/vgpu-operator:0.1.0", "ghcr.io/vgpu-operator/vgpu-device-plugin:0.1.0"),
    # A mirror replaces the registry of both images, whatever each image's own says.
    ({"global": {"imageRegistry": "mirror.example.com:5000/gpu"},
      "devicePlugin": {"image": {"registry": "quay.io", "tag": "v2"}}},
     "mirror.example.com:5000/gpu/vgpu-operator/vgpu-operator:0.1.0",
     "mirror.example.com:5000/gpu/vgpu-operator/vgpu-device-plugin:v2"),
    # A digest pins the image; a tag beside it would only mislead, so it is left out.
    ({"operator": {"image": {"digest": DIGEST, "tag": "ignored"}}},
     f"ghcr.io/vgpu-operator/vgpu-operator@{DIGEST}", "ghcr.io/vgpu-operator/vgpu-device-plugin:0.1.0"),
    # No registry: the repository is the whole name (Docker Hub, or a name with its own host).
    ({"operator": {"image": {"registry": "", "repository": "example/op", "tag": "1"}},
      "devicePlugin": {"image": {"registry": "", "repository": "local:5000/dp", "digest": DIGEST}}},
     "example/op:1", f"local:5000/dp@{DIGEST}"),
    # A repository with its own host, as values written for chart 0.1.0 before `registry` gave
    # it, is still the whole name: ghcr.io is not put in front of it.
    ({"operator": {"image": {"repository": "registry.example.com/team/op"}},
      "devicePlugin": {"image": {"repository": "localhost:5000/dp"}}},
     "registry.example.com/team/op:0.1.0", "localhost:5000/dp:0.1.0"),
])
def test_image_references(values: dict[str, Any], operator: str, plugin: str) -> None:
    assert images(values) == {"Deployment": {operator}, "DaemonSet": {plugin}}


@pytest.mark.parametrize(("values", "where"), [
    ({"operator": {"image": {"digest": "0123abcd"}}}, "/operator/image/digest"),
    ({"devicePlugin": {"image": {"digest": "sha256:XYZ"}}}, "/devicePlugin/image/digest"),
    ({"operator": {"image": {"registry": "ghcr.io/"}}}, "/operator/image/registry"),
    ({"global": {"imageRegistry": "https://mirror"}}, "/global/imageRegistry"),
])
def test_a_malformed_registry_or_digest_fails_install(values: dict[str, Any], where: str) -> None:
    with pytest.raises(chart.HelmError) as err:
        chart.template(values)
    assert f"at '{where}'" in str(err.value)


def test_a_mirror_in_front_of_a_repository_with_its_own_host_is_refused() -> None:
    values = {"global": {"imageRegistry": "mirror.example.com"},
              "operator": {"image": {"repository": "registry.example.com/team/op"}}}
    with pytest.raises(chart.HelmError) as err:
        chart.template(values)
    assert 'operator.image.repository "registry.example.com/team/op" names a registry' in str(err.value)
