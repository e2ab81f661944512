"""Load manifest files and folders (multi-document YAML, `kind: List` too) into an emulator."""

from __future__ import annotations

import pathlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import yaml
from vgpu_formats import yamlio

from vgpu_emulator.emulator import Emulator


class ManifestError(ValueError):
    """A manifest the emulator cannot load; the message names the file and document."""


def iter_manifests(path: str | pathlib.Path) -> Iterator[dict[str, Any]]:
    """Every object in a YAML file, or in the *.yaml / *.yml / *.json files of a folder (sorted)."""
    path = pathlib.Path(path)
    suffixes = (".yaml", ".yml", ".json")
    files = sorted(p for p in path.rglob("*") if p.suffix in suffixes) if path.is_dir() else [path]
    for file in files:
        try:
            documents = list(yaml.safe_load_all(file.read_text()))
        except yaml.YAMLError as exc:
            raise ManifestError(f"{file}: not valid YAML: {exc}") from exc
        for index, document in enumerate(documents):
            if document is None:
                continue
            if not isinstance(document, Mapping) or "kind" not in document:
                raise ManifestError(f"{file}: document {index} has no kind: not a Kubernetes object")
            items = yamlio.list_items(document)
            if items is not None:
                yield from items
            else:
                yield dict(document)


def load_objects(emulator: Emulator, objects: Iterable[Mapping[str, Any]]) -> int:
    """Create or replace each object (CRDs first, so their custom resources can follow). The
    namespaces the objects live in are created too, as they exist in any real cluster."""
    ordered = sorted(objects, key=lambda obj: obj.get("kind") != "CustomResourceDefinition")
    namespaces = {str((obj.get("metadata") or {}).get("namespace") or "") for obj in ordered} - {""}
    for namespace in sorted(namespaces):
        if emulator.get_object("Namespace", None, namespace) is None:
            emulator.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    for obj in ordered:
        try:
            emulator.apply(obj)
        except KeyError as exc:
            raise ManifestError(f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}: {exc}") from exc
    return len(ordered)


def load_manifests(emulator: Emulator, *paths: str | pathlib.Path) -> int:
    """Load every object found under the given files and folders; returns how many."""
    return load_objects(emulator, [obj for path in paths for obj in iter_manifests(path)])
