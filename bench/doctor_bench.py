"""`vgpuctl doctor` on a 5,000-node, 50,000-pod manifest directory: time and peak memory.

Target (issue 6): under 5 s and under 500 MB. The directory is generated in a temp dir from the
fixture cluster (its scheduler, device plugin and ConfigMaps, vGPU enabled), with nodes shaped like
the fixture's GPU nodes and pods like its vGPU pod: most running, 2 % pending, 0.1 % failed with
UnexpectedAdmissionError (so the pod diagnosis runs too).

Baseline, measured in the same run: the same process only parsing the same files with libyaml
(CSafeLoader), what reading every object costs. Figures are a subprocess's wall time and peak RSS
(summed over its process tree), so imports and interpreter start-up count as a user sees them.
"""

from __future__ import annotations

import copy
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "cluster"
NODES = 5_000
PODS = 50_000
PER_FILE = 1_000
HEALTHY_ARGS = {"deviceshare.VGPUEnable": True, "deviceshare.KnownGeometriesCMNamespace": "kube-system"}

PARSE_ONLY = """
import sys, yaml
from pathlib import Path
n = 0
for f in sorted(Path(sys.argv[1]).rglob("*.yaml")):
    with f.open("rb") as s:
        n += sum(1 for _ in yaml.load_all(s, Loader=yaml.CSafeLoader))
print(n)
"""


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _enable_vgpu(conf_map: dict[str, Any]) -> None:
    conf = yaml.safe_load(conf_map["data"]["volcano-scheduler.conf"])
    conf["tiers"][1]["plugins"].insert(1, {"name": "deviceshare", "arguments": dict(HEALTHY_ARGS)})
    conf_map["data"]["volcano-scheduler.conf"] = yaml.safe_dump(conf, sort_keys=False)


def generate(folder: Path) -> None:
    """Write the cluster: config objects, NODES nodes and PODS pods, PER_FILE objects a file."""
    sources = ("volcano-scheduler.yaml", "volcano-vgpu-device-plugin.yaml")
    config = [d for f in sources for d in _docs(FIXTURES / f)]
    for doc in config:
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "volcano-scheduler-configmap":
            _enable_vgpu(doc)
    (folder / "config.yaml").write_text(yaml.safe_dump_all(config))
    node_templates = _docs(FIXTURES / "nodes.yaml")
    pod_template = _docs(FIXTURES / "pods.yaml")[0]
    nodes = []
    for i in range(NODES):
        node = copy.deepcopy(node_templates[i % len(node_templates)])
        name = f"gpu-node-{i:05d}"
        node["metadata"]["name"] = name
        node["metadata"]["labels"]["kubernetes.io/hostname"] = name
        nodes.append(node)
    pods = []
    for i in range(PODS):
        pod = copy.deepcopy(pod_template)
        pod["metadata"]["name"] = f"job-{i:06d}"
        pod["metadata"]["uid"] = f"00000000-0000-0000-0000-{i:012d}"
        node = nodes[i % NODES]["metadata"]["name"]
        pod["metadata"]["annotations"]["volcano.sh/vgpu-node"] = node
        pod["metadata"]["annotations"]["volcano.sh/bind-phase"] = "success"
        pod["spec"]["nodeName"] = node
        pod["status"] = {"phase": "Running"}
        if i % 50 == 1:  # waiting for capacity: unbound, not annotated yet
            pod["metadata"]["annotations"] = {}
            pod["spec"].pop("nodeName")
            pod["status"] = {"phase": "Pending"}
        elif i % 1000 == 7:
            pod["status"] = {"phase": "Failed", "reason": "UnexpectedAdmissionError",
                             "message": "device request not found"}
        pods.append(pod)
    for kind, items in (("nodes", nodes), ("pods", pods)):
        for start in range(0, len(items), PER_FILE):
            chunk = items[start:start + PER_FILE]
            text = yaml.dump_all(chunk, Dumper=yaml.CSafeDumper, sort_keys=False)
            (folder / f"{kind}-{start // PER_FILE:03d}.yaml").write_text(text)


@dataclass
class Run:
    wall: float  # seconds
    cpu: float  # user + system seconds of the process tree (steadier than wall on a busy machine)
    peak_mb: float  # peak RSS summed over the process tree
    done: subprocess.CompletedProcess[str]


def _cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _measure(argv: list[str]) -> Run:
    """Wall and CPU seconds and peak RSS in MB of one command, its worker processes included
    (RSS sampled every 20 ms and summed over the process tree: what a memory limit would see)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        cpu_before = _cpu_of_children()
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True)  # files: no pipe to fill up
        peak = 0
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                tree = [root, *root.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in tree))
            except psutil.Error:
                pass
            time.sleep(0.02)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(argv, proc.returncode, out.read(), err.read())
    return Run(wall, _cpu_of_children() - cpu_before, peak / 1e6, done)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="doctor-bench-") as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        generate(folder)
        size_mb = sum(f.stat().st_size for f in folder.iterdir()) / 1e6
        took = time.perf_counter() - t0
        print(f"generated {NODES} nodes, {PODS} pods ({size_mb:.0f} MB of YAML) in {took:.1f} s")
        parse = _measure([sys.executable, "-c", PARSE_ONLY, str(folder)])
        doctor = _measure([sys.executable, "-m", "vgpuctl.main", "doctor", "-c", str(folder), "-o", "json"])
    if doctor.done.returncode not in (0, 1):
        raise SystemExit(f"doctor failed ({doctor.done.returncode}): {doctor.done.stderr[-2000:]}")
    load = os.getloadavg()[0]
    objects = parse.done.stdout.strip()
    print(f"baseline: parse only (CSafeLoader, {objects} objects): {parse.wall:.2f} s wall, "
          f"{parse.cpu:.2f} s CPU, peak RSS {parse.peak_mb:.0f} MB")
    print(f"vgpuctl doctor: {doctor.wall:.2f} s wall, {doctor.cpu:.2f} s CPU, peak RSS "
          f"{doctor.peak_mb:.0f} MB (target < 5 s, < 500 MB); exit {doctor.done.returncode} "
          f"(load average {load:.1f})")
    print(f"ratio doctor / parse-only: wall {doctor.wall / parse.wall:.2f}x, "
          f"CPU {doctor.cpu / parse.cpu:.2f}x")


if __name__ == "__main__":
    main()
