"""The operator's logs: kopf's own log configuration, and one INFO line per action on the cluster.

kopf formats every line that carries an object reference (`k8s_ref`): `[name] message` in text,
an `"object": {...}` field in JSON (cli.REFKEY, the node daemons' key too). Its handler lines
carry the VGPUPolicy's; `PolicyLogger` gives the Reconciler's lines (which run outside kopf's
handlers) the same reference, so the two read alike. Each write, restart and repair is one
`action` line whose `extra` fields (`action`, `target`, `reason`) come out as JSON fields for log
collectors.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from typing import Any, cast

import kopf
from vgpu_formats import cli

logger = logging.getLogger("vgpu_operator")


def configure(level: int, log_format: str) -> None:
    """Logging of the `vgpu-operator` process, through kopf's own configuration (one stderr
    handler on the root logger, the object prefix or field added by kopf's formatters)."""
    json_logs = log_format == "json"
    # kopf takes a format string too (typed as LogFormat only): text lines read like the node
    # daemons' and vgpuctl's (cli.TEXT_FORMAT), with kopf's `[name]` object prefix.
    text = cast(kopf.LogFormat, cli.TEXT_FORMAT)
    kopf.configure(debug=level <= logging.DEBUG, quiet=level >= logging.WARNING,
                   log_format=kopf.LogFormat.JSON if json_logs else text,
                   log_prefix=not json_logs, log_refkey=cli.REFKEY)
    root = logging.getLogger()
    root.setLevel(level)  # kopf knows three levels; --log-level error is a fourth
    if json_logs:  # kopf's JSON has no logger field; cli.JsonFormatter's (the node daemons') has
        for handler in root.handlers:
            handler.addFilter(_name_as_field)


def _name_as_field(record: logging.LogRecord) -> bool:
    record.logger = record.name
    return True


def reference(body: Mapping[str, Any]) -> dict[str, Any]:
    """The object reference kopf puts on its own lines about `body`."""
    meta = body.get("metadata") or {}
    return {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"), "name": meta.get("name"),
            "uid": meta.get("uid"), "namespace": meta.get("namespace")}


class PolicyLogger(logging.LoggerAdapter[logging.Logger]):
    """Lines about one VGPUPolicy. Not posted as Events by kopf (no `settings` in the record, and
    `k8s_skip`): the operator posts its own, one per action."""

    def __init__(self, body: Mapping[str, Any], base: logging.Logger = logger) -> None:
        super().__init__(base, {"k8s_ref": reference(body), "k8s_skip": True})

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        # LoggerAdapter replaces a call's `extra` with its own (before Python 3.13): merge them.
        kwargs["extra"] = {**(self.extra or {}), **(kwargs.get("extra") or {})}
        return msg, kwargs


def action(log: logging.Logger | logging.LoggerAdapter[Any], verb: str, kind: str, namespace: str | None,
           name: str, reason: str, detail: str = "") -> None:
    """One INFO line for one action on one object: `<verb> Kind ns/name: detail`, with `action`,
    `target` {kind, namespace, name} and `reason` (policy, drift, ...) as fields. (`name` and
    `kind` cannot be top-level extra keys: `name` is the logger's name in a LogRecord.)"""
    where = f"{namespace}/{name}" if namespace else name
    log.info("%s %s %s%s", verb, kind, where, f": {detail}" if detail else "",
             extra={"action": verb, "target": {"kind": kind, "namespace": namespace, "name": name},
                    "reason": reason})
