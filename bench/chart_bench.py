"""Helm chart figures: `helm template` time and objects rendered, default and full profiles.

1. `helm template` wall time (median of N runs, CRDs included) for the default install and for
   the "full" profile (HA, ServiceMonitors, PrometheusRule, a policy spec...), against the
   baseline `helm version` in the same run: the ratio is the chart's own cost over starting helm.
2. Objects rendered per profile, by kind.
3. kubernetes-validate (strict, Kubernetes 1.33) per built-in object, against the YAML parse
   time per rendered object (CRDs included): what the chart suite pays for schema validation.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from functools import partial

import kubernetes_validate

from tests.charts import chart

RUNS = int(os.environ.get("BENCH_RUNS", "15"))
PROFILES = ("default", "full")


def median_seconds(fn: Callable[[], object], runs: int = RUNS) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def helm_version() -> None:
    subprocess.run([str(chart.helm()), "version", "--short"], capture_output=True, check=True)


def main() -> None:
    baseline = median_seconds(helm_version)
    print(f"baseline `helm version`: {baseline * 1000:.1f} ms (median of {RUNS})")
    for profile in PROFILES:
        values = chart.PROFILES[profile]
        rendered = chart.template(values, include_crds=True)
        objs = chart.objects(rendered)
        seconds = median_seconds(partial(chart.template, values, include_crds=True))
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(Counter(o["kind"] for o in objs).items()))
        print(f"{profile:>8}: helm template {seconds * 1000:.1f} ms = {seconds / baseline:.2f}x baseline; "
              f"{len(objs)} objects, {len(rendered) // 1024} KiB ({kinds})")

        # What the chart suite hands to kubernetes-validate: neither kinds of the shipped CRDs
        # (checked against those) nor the Prometheus Operator's (not checked).
        custom = chart.UNCHECKED_KINDS | {c["spec"]["names"]["kind"]
                                          for c in chart.of_kind(objs, "CustomResourceDefinition")}
        builtin = [o for o in objs if o["kind"] not in custom]
        start = time.perf_counter()
        for obj in builtin:
            kubernetes_validate.validate(obj, "1.33", strict=True)
        validate = (time.perf_counter() - start) / len(builtin)
        parse = median_seconds(partial(chart.objects, rendered), runs=5) / len(objs)
        print(f"{profile:>8}: kubernetes-validate {validate * 1000:.1f} ms/object over {len(builtin)} "
              f"objects = {validate / parse:.0f}x YAML parse ({parse * 1000:.2f} ms/object)")


if __name__ == "__main__":
    main()
