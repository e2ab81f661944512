"""Label and field selectors, as the Kubernetes API server reads them from a query string.

Pure functions: parse once per request, then match each stored object.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Matcher = Callable[[Mapping[str, Any]], bool]


class SelectorError(ValueError):
    """A selector the API server would reject with 400 Bad Request."""


def _split_terms(text: str) -> list[str]:
    """Split on commas outside parentheses: `a in (x,y),b` -> [`a in (x,y)`, `b`]."""
    terms: list[str] = []
    depth = 0
    current = ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        terms.append(current.strip())
    return [term for term in terms if term]


_SET_TERM = re.compile(r"^(?P<key>[^\s!=()]+)\s+(?P<op>in|notin)\s+\((?P<values>[^()]*)\)$")
_EQ_TERM = re.compile(r"^(?P<key>[^\s!=()]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s!=()]*)$")
_EXISTS_TERM = re.compile(r"^(?P<neg>!?)\s*(?P<key>[^\s!=()]+)$")


def _label_term(term: str) -> Matcher:
    if match := _SET_TERM.match(term):
        key, op = match["key"], match["op"]
        values = {value.strip() for value in match["values"].split(",") if value.strip()}
        if op == "in":
            return lambda labels: key in labels and labels[key] in values
        return lambda labels: key not in labels or labels[key] not in values
    if match := _EQ_TERM.match(term):
        key, op, value = match["key"], match["op"], match["value"]
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: key in labels and labels[key] == value
    if match := _EXISTS_TERM.match(term):
        key, negated = match["key"], bool(match["neg"])
        return lambda labels: (key in labels) != negated
    raise SelectorError(f"unable to parse requirement {term!r} in labelSelector")


def parse_label_selector(text: str | None) -> Matcher:
    """A matcher over an object's labels (equality- and set-based, as in kubectl -l)."""
    terms = [_label_term(term) for term in _split_terms(text or "")]

    def matches(obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(term(labels) for term in terms)

    return matches


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The value at a dotted path as the API server compares it (missing -> empty string)."""
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return ""
        node = node[part]
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def _field_term(term: str) -> Matcher:
    match = _EQ_TERM.match(term)
    if not match:
        raise SelectorError(f"invalid fieldSelector term {term!r}: use path=value or path!=value")
    path, op, value = match["key"], match["op"], match["value"]
    if op == "!=":
        return lambda obj: field_value(obj, path) != value
    return lambda obj: field_value(obj, path) == value


def parse_field_selector(text: str | None) -> Matcher:
    """A matcher over dotted field paths (metadata.name, spec.nodeName, status.phase, ...)."""
    terms = [_field_term(term) for term in _split_terms(text or "")]
    return lambda obj: all(term(obj) for term in terms)
