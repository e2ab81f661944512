"""Rewrite a YAML text someone else wrote, changing only what must change.

The scheduler conf and device-config are edited, not owned: their writers' comments, anchors, key
order, quoting and indentation must survive the operator's edit. ruamel.yaml's round trip keeps
them for every node whose data did not change; changed nodes take the new value. The result is
read back with `yamlio` (Go's reading): when it does not mean exactly `desired` (an anchor shared
by a changed and an unchanged place, a merge key), the plain dump is used instead, so a rewrite
can lose formatting but never meaning.
"""

from __future__ import annotations

import difflib
import io
import itertools
import json
import re
from collections.abc import Callable
from typing import Any

import yaml

from vgpu_formats import yamlio


def rewrite(live_text: str, desired: Any, dump: Callable[[Any], str]) -> str:
    """`live_text` edited to mean `desired`; `dump(desired)` when the edit cannot keep the text."""
    try:
        text = _round_trip(live_text, desired)
        if _same(yamlio.load(text), desired):
            return text
    except Exception:  # any failure of the formatting-keeping path falls back to the plain dump
        pass
    return dump(desired)


def _round_trip(live_text: str, desired: Any) -> str:
    from ruamel.yaml import YAML  # imported when a rewrite happens: it costs memory at rest

    mapping, offset = _indentation(live_text)
    editor = YAML(typ="rt")
    editor.preserve_quotes = True
    editor.width = 4096  # never fold a long line the writer kept on one
    editor.indent(mapping=mapping, sequence=offset + 2, offset=offset)
    doc = _merge(editor.load(live_text), desired)
    out = io.StringIO()
    editor.dump(doc, out)
    return out.getvalue()


def _indentation(text: str) -> tuple[int, int]:
    """(mapping indent, offset of `- ` under its key) as the writer used them; (2, 0) by default."""
    mapping = offset = None
    for before, line in itertools.pairwise(text.splitlines()):
        if not before.rstrip().endswith(":") or before.lstrip().startswith("#"):
            continue
        key_column = re.match(r"(?:\s*-\s)*\s*", before).end()  # type: ignore[union-attr]  # always matches
        step = (len(line) - len(line.lstrip(" "))) - key_column
        if line.lstrip().startswith("- ") and offset is None:
            offset = max(step, 0)
        elif re.match(r"\s+[^\s#-]", line) and mapping is None and step > 0:
            mapping = step
    return mapping or 2, offset or 0


def _merge(live: Any, desired: Any) -> Any:
    """`live` (round-trip nodes) changed in place where it differs from `desired` (plain data)."""
    if isinstance(live, dict) and isinstance(desired, dict):
        by_text = {_key_text(key): key for key in live}
        for text, key in by_text.items():
            if text not in desired:
                del live[key]
        for key, value in desired.items():
            if key in by_text:
                live[by_text[key]] = _merge(live[by_text[key]], value)
            else:
                live[key] = value
        return live
    if isinstance(live, list) and isinstance(desired, list):
        matcher = difflib.SequenceMatcher(None, [_signature(v) for v in live],
                                          [_signature(v) for v in desired], autojunk=False)
        merged: list[Any] = []
        for _, i1, i2, j1, j2 in matcher.get_opcodes():
            # Equal items, and changed ones in place of each other, keep their round-trip node;
            # inserted ones are new, deleted ones go.
            paired = min(i2 - i1, j2 - j1)
            pairs = zip(live[i1:i1 + paired], desired[j1:j1 + paired], strict=True)
            merged += [_merge(a, b) for a, b in pairs]
            merged += desired[j1 + paired:j2]
        live[:] = merged
        return live
    return live if _same(_go_value(live), desired) else desired


def _key_text(key: Any) -> str:
    """A round-trip key as Go reads key text (ruamel reads YAML 1.2: `1:` is an int, `on:` a str)."""
    if key is None:
        return ""
    if isinstance(key, bool):
        return "true" if key else "false"
    return str(key)


def _signature(value: Any) -> str:
    """What identifies a list item across an edit: a plugin's name, else its whole content."""
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        return "name:" + value["name"]
    return json.dumps(value, sort_keys=True, default=str)


def _go_value(value: Any) -> Any:
    """A round-trip scalar as Go's yaml.v2 reads it: a plain (unquoted) `yes` is a bool there."""
    if type(value) is str:  # plain; quoted strings are ruamel str subclasses
        try:
            return yaml.load(value, Loader=yaml.SafeLoader) if value else value
        except yaml.YAMLError:
            return value
    return value


def _same(a: Any, b: Any) -> bool:
    """Equal data, types included (Python's True == 1 and 1 == 1.0 hide changes Go sees)."""
    return json.dumps(a, sort_keys=True, default=repr) == json.dumps(b, sort_keys=True, default=repr)
