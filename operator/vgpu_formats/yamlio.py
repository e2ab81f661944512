"""Parsing of texts someone else wrote (ConfigMap values, manifest files), bounded and as Go reads them.

Anyone who may edit the scheduler ConfigMap can hand the operator and every device plugin a text
built to hurt them: nested a million levels deep (libyaml's composer recurses in C and crashes the
process; PyYAML's constructor raises RecursionError), or a few hundred bytes of aliases that expand
to billions of nodes when walked. So every text is first scanned as an event stream (iterative,
stopping at the first excess) against `Limits`, and only then built into objects.

Mapping keys are the key's text, as Go's yaml.v2 reads keys into `string` (Volcano's conf and the
device-config are decoded that way): `on:` is the key "on", `1:` the key "1", `~:` the key "". A
sequence or mapping used as a key is refused with its line (Go cannot decode it either).

libyaml's C parser when PyYAML was built with it, and a small cache keyed by the text: one
reconcile reads the same device-config and scheduler conf several times. Callers get a fresh copy.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml
from yaml import events

_BASE: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_NULL_TAG = "tag:yaml.org,2002:null"


@dataclass(frozen=True)
class Limits:
    """What one text may hold. `max_alias_nodes`: how many nodes aliases may add when expanded."""

    max_bytes: int
    max_depth: int = 64
    max_alias_nodes: int = 10_000


# One ConfigMap value: the API server refuses objects over about 1 MiB anyway. Volcano's conf is 4
# levels deep, device-config 6, a node-config entry 4.
CONFIG = Limits(max_bytes=1 << 20)
# Manifest files for vgpuctl: whole-cluster dumps are large, and managedFields nest deeper.
MANIFESTS = Limits(max_bytes=1 << 30, max_depth=128, max_alias_nodes=100_000)


class RefusedText(yaml.YAMLError, ValueError):
    """A text refused before it was built into objects; the message says why and where."""


def describe(exc: Exception) -> str:
    """One line for a failed load: `not valid YAML at line 3, column 7 (found ...)`, or the
    RefusedText's own message."""
    if isinstance(exc, RefusedText):
        return str(exc)
    mark = getattr(exc, "problem_mark", None)
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or next(iter(str(exc).splitlines()), "")
    return f"not valid YAML{at}" + (f" ({problem})" if problem else "")


def _mark_line(mark: Any) -> int:
    """A mark's line from 1, 0 without one (libyaml's C marks are a class of their own)."""
    return mark.line + 1 if mark is not None else 0


def _line(event: events.Event | yaml.Node) -> int:
    return _mark_line(event.start_mark)


def _check_size(text: str, limits: Limits) -> None:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_bytes:
        raise RefusedText(f"{size} bytes, more than the {limits.max_bytes} accepted here")


def _events(text: str, limits: Limits) -> Iterator[events.Event]:
    """The text's events. libyaml 0.2.6 (bundled with PyYAML 6.0.4) stops past 1000 levels on its
    own, in its scanner, before the event that would cross `limits.max_depth` reaches `check`:
    that is the same refusal, so it reads the same."""
    try:
        yield from yaml.parse(text, Loader=_BASE)
    except yaml.MarkedYAMLError as exc:
        if "nesting depth" not in (exc.problem or ""):
            raise
        raise RefusedText(f"nested deeper than {limits.max_depth} levels at line "
                          f"{_mark_line(exc.problem_mark)}") from exc


def check(text: str, limits: Limits) -> None:
    """Raise RefusedText when `text` is larger, deeper or alias-heavier than `limits` allow.

    Counts nodes as they would be after alias expansion: each anchor remembers the size and height
    of what it names, and an alias adds them where it stands. Raises yaml.YAMLError for bad syntax.
    """
    _check_size(text, limits)
    # One frame per open collection: [anchor, nodes counted when it opened, height below it].
    frames: list[list[Any]] = []
    anchors: dict[str, tuple[int, int]] = {}  # anchor -> (nodes, height)
    nodes = added = 0
    for event in _events(text, limits):
        if isinstance(event, (events.MappingStartEvent, events.SequenceStartEvent)):
            nodes += 1
            frames.append([event.anchor, nodes, 1])
            if len(frames) > limits.max_depth:
                raise RefusedText(f"nested deeper than {limits.max_depth} levels at line {_line(event)}")
        elif isinstance(event, (events.MappingEndEvent, events.SequenceEndEvent)):
            anchor, opened, height = frames.pop()
            if anchor:
                anchors[anchor] = (nodes - opened + 1, height)
            if frames:
                frames[-1][2] = max(frames[-1][2], height + 1)
        elif isinstance(event, events.ScalarEvent):
            nodes += 1
            if event.anchor:
                anchors[event.anchor] = (1, 0)
        elif isinstance(event, events.AliasEvent):
            count, height = anchors.get(event.anchor or "", (1, 0))
            nodes += count
            added += count
            if added > limits.max_alias_nodes:
                raise RefusedText(f"aliases expand to more than {limits.max_alias_nodes} nodes at line "
                                 f"{_line(event)}; write the values out instead of repeating an alias")
            if len(frames) + height > limits.max_depth:
                raise RefusedText(f"nested deeper than {limits.max_depth} levels at line {_line(event)} "
                                 "(through an alias)")
            if frames:
                frames[-1][2] = max(frames[-1][2], height + 1)


class _Loader(_BASE):  # type: ignore[misc,valid-type]
    """The safe loader with Go's string keys (see the module docstring)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)  # `<<:` merge keys, as Go's yaml.v2 merges them
        mapping: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                kind = "sequence" if isinstance(key_node, yaml.SequenceNode) else "mapping"
                column = key_node.start_mark.column + 1
                raise RefusedText(f"the key at line {_line(key_node)}, column {column} is a {kind}; Go reads "
                                  "only plain keys: write it as a string")
            key = "" if key_node.tag == _NULL_TAG else key_node.value
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping


# YAML 1.1 (PyYAML) wants a dot and a signed exponent in a float; Go's yaml.v2 and JSON read `1e-300`
# and `2.5e3` as numbers too, and so does the API server: so do we.
_Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                              re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$"),
                              list("-+0123456789"))


@functools.lru_cache(maxsize=16)
def _load(text: str, limits: Limits) -> Any:
    check(text, limits)
    return yaml.load(text, Loader=_Loader)


def load(text: str, limits: Limits = CONFIG) -> Any:
    """One YAML document, bounded by `limits`; raises yaml.YAMLError (RefusedText included)."""
    return copy.deepcopy(_load(text, limits))


def load_all(text: str, limits: Limits = MANIFESTS) -> list[Any]:
    """Every document of a multi-document text, bounded by `limits` as a whole."""
    check(text, limits)
    return list(yaml.load_all(text, Loader=_Loader))


def load_json(text: str, limits: Limits = CONFIG) -> Any:
    """A JSON document, bounded by `limits` (the C decoder stops at Python's recursion limit;
    what it lets through is still checked). Raises ValueError (json.JSONDecodeError, RefusedText)."""
    _check_size(text, limits)
    try:
        doc = json.loads(text)
    except RecursionError:
        raise RefusedText(f"nested deeper than {limits.max_depth} levels") from None
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > limits.max_depth:
                    raise RefusedText(f"nested deeper than {limits.max_depth} levels")
                stack.append((child, depth + 1))
    return doc


def clear_cache() -> None:
    """Forget every parsed text (benchmarks measure the cold path with it)."""
    _load.cache_clear()


def list_items(doc: Any) -> list[Any] | None:
    """The objects of a `kind: List` document (`kubectl get -o yaml` writes one, and so do
    `PodList`, `ConfigMapList`, ...); None for any other document."""
    if isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List"):
        items = doc.get("items")
        if isinstance(items, list):
            return items
    return None
