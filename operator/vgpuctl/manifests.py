"""Read Kubernetes objects from manifest files and directories, later sources overlaying earlier.

`vgpuctl doctor -f cluster/ -f scenario.yaml`: a scenario file replaces the objects of the same
kind, namespace and name in the cluster directory, the way `kubectl apply` would. Multi-document
YAML is streamed with libyaml's CSafeLoader when available (a 5,000-node directory must load in
seconds); `kind: List` documents are expanded.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

try:
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover - libyaml is part of every PyYAML wheel we use
    from yaml import SafeLoader as _Loader  # type: ignore[assignment]

SUFFIXES = (".yaml", ".yml", ".json")

Key = tuple[str, str, str]


class ManifestError(ValueError):
    """A manifest that cannot be read; the message names the file (and line) and the fix."""


def object_key(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (str(obj.get("kind", "")), str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def manifest_files(path: Path) -> list[Path]:
    """The manifest files under `path` (itself if a file), in a stable order."""
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
    raise ManifestError(f"{path}: no such file or directory (pass a manifest file or a directory of them)")


def iter_file(path: Path) -> Iterator[dict[str, Any]]:
    """Every object in one file; `kind: List` items are yielded one by one."""
    try:
        with path.open("rb") as stream:
            for doc in yaml.load_all(stream, Loader=_Loader):
                yield from _expand(doc, path)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(err, "problem", err)
        raise ManifestError(f"{where}: not valid YAML ({problem}); fix the syntax") from err
    except OSError as err:
        raise ManifestError(f"{path}: cannot read ({err.strerror})") from err


def _expand(doc: Any, path: Path) -> Iterator[dict[str, Any]]:
    if doc is None:
        return
    if not isinstance(doc, dict):
        raise ManifestError(f"{path}: a document is a {type(doc).__name__}, expected a Kubernetes object")
    if str(doc.get("kind", "")).endswith("List") and isinstance(doc.get("items"), list):
        for item in doc["items"]:
            yield from _expand(item, path)
        return
    if "kind" not in doc:
        raise ManifestError(f"{path}: an object has no `kind` (is this a Kubernetes manifest?)")
    yield doc


def load_objects(paths: Sequence[Path | str]) -> list[dict[str, Any]]:
    """Objects from all `paths`; an object replaces an earlier one with the same kind/ns/name.

    The result keeps first-seen order, so output stays stable when a scenario overlays a cluster.
    """
    merged: dict[Key, dict[str, Any]] = {}
    for raw in paths:
        for file in manifest_files(Path(raw)):
            for obj in iter_file(file):
                merged[object_key(obj)] = obj
    return list(merged.values())


def of_kind(objects: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o.get("kind") == kind]
