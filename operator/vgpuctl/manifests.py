"""Read Kubernetes objects from manifest files and directories, later sources overlaying earlier.

`vgpuctl doctor -f cluster/ -f scenario.yaml`: a scenario file replaces the objects of the same
kind, namespace and name in the cluster directory, the way `kubectl apply` would. Multi-document
YAML is parsed with libyaml's CSafeLoader when available (a 5,000-node directory must load in
seconds), bounded by `yamlio.MANIFESTS`; `kind: List` documents are expanded.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from vgpu_formats import yamlio

SUFFIXES = (".yaml", ".yml", ".json")

Key = tuple[str, str, str]


class ManifestError(ValueError):
    """A manifest that cannot be read; the message names the file (and line) and the fix."""


def object_key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (str(obj.get("kind", "")), str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def manifest_files(path: Path) -> list[Path]:
    """The manifest files under `path` (itself if a file), in a stable order."""
    if path.is_file():
        return [path]
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
        if not found:  # an empty cluster would pass for one missing every object
            raise ManifestError(f"no manifests found in {path} (no {', '.join(SUFFIXES)} files)")
        return found
    raise ManifestError(f"{path}: no such file or directory")


def iter_file(path: Path, prefilter: Prefilter | None = None) -> Iterator[dict[str, Any]]:
    """Every object in one file; `kind: List` items are yielded one by one.

    With a `prefilter`, each document's text is first offered to it (see `Prefilter`): a command
    that needs a few fields of a few kinds parses far less YAML (PyYAML builds Python objects
    slowly, even with libyaml: 5,000 full Node objects take seconds).
    """
    try:
        if prefilter is None:
            for doc in yamlio.load_all(path.read_text(encoding="utf-8")):
                yield from _expand(doc, path)
            return
        for chunk in _DOCUMENT_SEPARATOR.split(path.read_text(encoding="utf-8")):
            kind = _KIND_LINE.search(chunk)
            text = prefilter(kind.group(1), chunk) if kind else chunk
            if text is None:
                continue
            docs = yamlio.load_all(text)
            if text is not chunk and not (len(docs) == 1 and isinstance(docs[0], dict) and "kind" in docs[0]):
                docs = yamlio.load_all(chunk)
            for doc in docs:
                yield from _expand(doc, path)
    except yamlio.RefusedText as err:
        raise ManifestError(f"{path}: refused: {err}") from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None and prefilter is None else str(path)
        problem = getattr(err, "problem", err)
        raise ManifestError(f"{where}: not valid YAML ({problem}); fix the syntax") from err
    except (OSError, UnicodeDecodeError) as err:
        raise ManifestError(f"{path}: cannot read ({err})") from err


def _expand(doc: Any, path: Path) -> Iterator[dict[str, Any]]:
    if doc is None:
        return
    if not isinstance(doc, dict):
        raise ManifestError(f"{path}: a document is a {type(doc).__name__}, expected a Kubernetes object")
    items = yamlio.list_items(doc)
    if items is not None:
        for item in items:
            yield from _expand(item, path)
        return
    if "kind" not in doc:
        raise ManifestError(f"{path}: an object has no `kind` (is this a Kubernetes manifest?)")
    problem = shape_problem(doc)
    if problem:
        raise ManifestError(f"{path}: {doc.get('kind')} {_name_of(doc)}: {problem}")
    yield doc


# The kinds whose pod template the commands read, and where it sits.
_POD_TEMPLATE_KINDS = frozenset({"Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"})


def shape_problem(obj: Mapping[str, Any]) -> str | None:
    """Where `obj` is not shaped as the API server would have it, in the fields the commands
    read (a file can hold anything; the API server's objects always pass), naming the field."""
    checks: list[tuple[str, Any, type]] = [("metadata", obj.get("metadata"), dict)]
    if obj.get("kind") == "ConfigMap":
        data = obj.get("data")
        checks.append(("data", data, dict))
        if isinstance(data, dict):
            checks += [(f"data.{key}", value, str) for key, value in data.items()]
    spec = obj.get("spec")
    if obj.get("kind") in _POD_TEMPLATE_KINDS or obj.get("kind") == "Pod":
        checks.append(("spec", spec, dict))
    if obj.get("kind") in _POD_TEMPLATE_KINDS and isinstance(spec, dict):
        template = spec.get("template")
        checks.append(("spec.template", template, dict))
        pod_spec = template.get("spec") if isinstance(template, dict) else None
        checks.append(("spec.template.spec", pod_spec, dict))
        where, spec = "spec.template.spec", pod_spec
    else:
        where = "spec"
    if isinstance(spec, dict) and (obj.get("kind") in _POD_TEMPLATE_KINDS or obj.get("kind") == "Pod"):
        for field in ("containers", "initContainers"):
            containers = spec.get(field)
            checks.append((f"{where}.{field}", containers, list))
            for i, container in enumerate(containers if isinstance(containers, list) else []):
                checks.append((f"{where}.{field}[{i}]", container, dict))
                if isinstance(container, dict):
                    checks += [(f"{where}.{field}[{i}].{key}", container.get(key), list)
                               for key in ("args", "command", "env")]
    for field, value, expected in checks:
        if value is not None and not isinstance(value, expected):
            return f"`{field}` is {_a(value)}, expected {_TYPE_NAMES[expected]}; fix the manifest"
    return None


_TYPE_NAMES: dict[type, str] = {dict: "a mapping", list: "a list", str: "a string"}


def _a(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return _TYPE_NAMES.get(type(value), f"a {type(value).__name__}")


def _name_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return "(no name)"
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


# A line that is exactly `---` separates documents (the YAML spec forbids it inside any scalar).
_DOCUMENT_SEPARATOR = re.compile(r"(?m)^---[ \t]*$")
_KIND_LINE = re.compile(r"(?m)^kind:[ \t]*[\"']?([A-Za-z]+)")


def _is_key_line(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith(("#", "- ", "...")) and stripped != "-"


def trim_document(text: str, keep: Mapping[str, frozenset[str] | None]) -> str:
    """The block-style document with only the top-level keys in `keep` and, where `keep` names a
    set, only those second-level keys. Flow-style text (JSON) comes back unchanged."""
    first = next((ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")
    if first.lstrip().startswith(("{", "[")):
        return text
    out: list[str] = []
    section: frozenset[str] | None = None
    keeping = keeping_child = False
    child_indent = -1
    for line in text.splitlines(keepends=True):
        if not line[:1].isspace() and _is_key_line(line):  # a top-level key
            key = line.split(":", 1)[0].strip("\"' ")
            keeping = key in keep
            section = keep.get(key)
            keeping_child, child_indent = section is None, -1
            if keeping:
                out.append(line)
            continue
        if not keeping:
            continue
        if section is not None and _is_key_line(line):
            indent = len(line) - len(line.lstrip(" "))
            if child_indent < 0:
                child_indent = indent
            if indent == child_indent:
                keeping_child = line.strip().split(":", 1)[0].strip("\"' ") in section
        if keeping_child:
            out.append(line)
    return "".join(out)


class Prefilter:
    """Decides, from a document's text, whether and how much of it to parse.

    Called with the document's `kind` (read from its top-level `kind:` line) and its text; returns
    the text to parse (maybe trimmed), or None to skip the document. Must be picklable.
    """

    def __call__(self, kind: str, text: str) -> str | None:
        return text


def _load_file(job: tuple[Path, Prefilter | None]) -> list[dict[str, Any]]:
    return list(iter_file(*job))


PARALLEL_BYTES = 8_000_000  # below this, a second process costs more than it saves


def load_objects(paths: Sequence[Path | str], prefilter: Prefilter | None = None) -> list[dict[str, Any]]:
    """Objects from all `paths`; an object replaces an earlier one with the same kind/ns/name.

    The result keeps first-seen order, so output stays stable when a scenario overlays a cluster.
    Large inputs are parsed by one process per CPU (files in order, results merged in order).
    """
    files = [file for raw in paths for file in manifest_files(Path(raw))]
    jobs = [(file, prefilter) for file in files]
    size = sum(file.stat().st_size for file in files)
    workers = min(os.cpu_count() or 1, len(files))
    if workers > 1 and size > PARALLEL_BYTES:
        context = multiprocessing.get_context("fork")
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            per_file = list(pool.map(_load_file, jobs, chunksize=max(1, len(jobs) // (workers * 4))))
    else:
        per_file = [_load_file(job) for job in jobs]
    merged: dict[Key, dict[str, Any]] = {}
    for objects in per_file:
        for obj in objects:
            merged[object_key(obj)] = obj
    return list(merged.values())


def of_kind(objects: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o.get("kind") == kind]
