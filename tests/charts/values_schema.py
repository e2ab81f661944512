"""Keep `policy.spec` in the chart's values.schema.json equal to the VGPUPolicy CRD's spec schema.

helm checks values against values.schema.json before rendering, so a misspelt policy field fails
`helm install` with the field's path, instead of being pruned silently by the API server.

    python -m tests.charts.values_schema --write   # after the CRD changes
    python -m tests.charts.values_schema --check   # what the test runs
"""

from __future__ import annotations

import json
import sys
from typing import Any

import yaml

from tests.charts.chart import CHART, CRD_FILE, crd_schema, to_json_schema

SCHEMA_FILE = CHART / "values.schema.json"
SPEC_DESCRIPTION = (
    "VGPUPolicy spec passed through to the default policy (generated from crds/ by "
    "`python -m tests.charts.values_schema --write`). Where things live (scheduler, devicePlugin "
    "and targets locations) comes from the chart values of those names."
)


def json_dump(data: Any) -> str:
    return json.dumps(data, indent=2) + "\n"


def expected_schema() -> dict[str, Any]:
    """values.schema.json with policy.spec replaced by the CRD's spec schema."""
    schema: dict[str, Any] = json.loads(SCHEMA_FILE.read_text())
    crd = yaml.safe_load(CRD_FILE.read_text())
    spec = to_json_schema(crd_schema(crd)["properties"]["spec"])
    spec["description"] = SPEC_DESCRIPTION
    schema["properties"]["policy"]["properties"]["spec"] = spec
    return schema


def main(argv: list[str]) -> int:
    want = json_dump(expected_schema())
    if argv == ["--write"]:
        SCHEMA_FILE.write_text(want)
        return 0
    if argv == ["--check"]:
        if SCHEMA_FILE.read_text() != want:
            print(f"{SCHEMA_FILE} is stale: run python -m tests.charts.values_schema --write",
                  file=sys.stderr)
            return 1
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
