"""Unified diffs of rendered targets, live vs desired, as `kubectl diff` shows them."""

from __future__ import annotations

import difflib
from typing import Any

import yaml
from vgpu_operator.render.target import TargetRender

# Server-maintained fields: never part of what the operator would change.
VOLATILE_METADATA = ("resourceVersion", "uid", "generation", "creationTimestamp", "managedFields")


def _clean(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    if obj is None:
        return None
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in VOLATILE_METADATA}
    return {**{k: v for k, v in obj.items() if k != "status"}, "metadata": meta}


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (ConfigMap data) as `|` blocks, so a diff shows the changed lines."""

    def choose_scalar_style(self) -> str:
        # PyYAML gives up the block for a line with trailing spaces (upstream's device-config
        # has `geometries: `) and wrote the whole text as one escaped line; a literal block keeps
        # them, and this text is read by people, not parsed back.
        event = self.event
        if (isinstance(event, yaml.ScalarEvent) and event.style == "|" and not self.flow_level
                and not self.simple_key_context):
            self.analysis = self.analysis or self.analyze_scalar(event.value)
            return "|"
        return str(super().choose_scalar_style())


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value and not any(c in value for c in "\t\r") else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def _text(obj: dict[str, Any] | None) -> list[str]:
    if obj is None:
        return []
    text = yaml.dump(obj, Dumper=_BlockDumper, sort_keys=False, width=1000, allow_unicode=True)
    return text.splitlines(keepends=True)


def target_diff(target: TargetRender) -> str:
    """The change the operator would write to this target; "" when nothing changes."""
    if not target.changed or target.desired is None:
        return ""
    live = _clean(target.live)
    desired = _clean(target.desired)
    before = "/dev/null" if live is None else f"live/{target.ref}"
    return "".join(difflib.unified_diff(_text(live), _text(desired), before, f"desired/{target.ref}"))
