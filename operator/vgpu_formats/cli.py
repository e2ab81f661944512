"""What every command of the project says the same way: its version, its log flags, its logs.

`vgpu-operator`, `deviceplugin`, `vgpu-monitor` and `vgpuctl` all take `--version`,
`--log-level` and `--log-format text|json` from `add_common_flags`, so a platform team sets
logging once for the whole project. `-v/--verbose` stays as a short `--log-level debug`.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
import traceback
from datetime import UTC, datetime
from importlib import metadata
from typing import Any, NoReturn

DISTRIBUTION = "vgpu-operator"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# The JSON keys kopf's own JSON logs (python-json-logger, kopf's ObjectJsonFormatter) use for the
# object a line is about and for a traceback; the operator (vgpu_operator/logs.py) and the node
# daemons (JsonFormatter) write both alike.
REFKEY = "object"
EXCEPTION_KEY = "exc_info"

# LogRecord attributes that are not extra fields (`logger.info(..., extra={...})` adds the others),
# and kopf's internals it adds to its object loggers' records (an OperatorSettings repr of ~2 KB, the
# "not an Event" flag), which its own JSON leaves out too.
_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "settings", "k8s_skip", "k8s_ref"}


@functools.cache
def version() -> str:
    """The installed package's version; a source tree that was never installed says so. Cached:
    the metadata lookup scans sys.path, and the monitor asks on every scrape."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    """--version, --log-level, --log-format and -v/--verbose, spelled alike in every command."""
    parser.add_argument("--version", action="version", version=f"{parser.prog} {version()}")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info", help="least severe line logged")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                        help="text for people, json (one object per line) for log collectors")
    parser.add_argument("--verbose", "-v", dest="log_level", action="store_const", const="debug",
                        help="same as --log-level debug")


def log_level(args: argparse.Namespace) -> int:
    """The logging level the parsed flags ask for."""
    return int(getattr(logging, str(getattr(args, "log_level", "info")).upper()))


# kopf's JSON severities (kopf's ObjectJsonFormatter), so both kinds of log lines sort alike.
_SEVERITY = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warn",
             logging.ERROR: "error", logging.CRITICAL: "fatal"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and any `extra` fields as they are.

    The field names match the ones kopf's JSON logs use (`timestamp`, `severity`, `message`,
    REFKEY, EXCEPTION_KEY), so one collector configuration reads the operator and the node daemons
    alike. An extra field named like a base field does not replace it.
    """

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "severity": _SEVERITY.get(record.levelno, record.levelname.lower()),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = vars(record)
        if "k8s_ref" in fields:  # kopf's object reference, under kopf's JSON key
            entry[REFKEY] = fields["k8s_ref"]
        if record.exc_info:
            entry[EXCEPTION_KEY] = self.formatException(record.exc_info)
        for key, value in fields.items():
            if key not in _RECORD_FIELDS:
                entry.setdefault(key, value)  # the fields above win over an extra of the same name
        return json.dumps(entry, default=str, ensure_ascii=False)


class StderrHandler(logging.StreamHandler):
    """Writes to the `sys.stderr` of the moment: a `main()` called in-process (tests, the demo)
    must not leave a handler on a stream that a capture has since closed."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def configure_logging(level: int, log_format: str) -> None:
    """Logging of a process that does not run kopf (the plugin, the monitor, vgpuctl): to stderr."""
    handler = StderrHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    # Only our own earlier handler goes (a second main() in one process): others, such as
    # pytest's capture, stay, as kopf.configure leaves them.
    for old in [h for h in root.handlers if isinstance(h, StderrHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


def report(prog: str, message: str, exc: BaseException | None = None, log_format: str = "text") -> int:
    """One `prog: error: message` line on stderr, argparse's form; 1, the exit status (argparse's
    usage errors exit 2). `exc`, given at --log-level debug only, is printed as a traceback first.
    --log-format json: one JSON record instead (severity fatal, logger `prog`, the traceback as
    EXCEPTION_KEY), so a log collector does not get the one line that matters most as plain text."""
    line = " ".join(message.split())
    if log_format == "json":
        record = logging.LogRecord(prog, logging.CRITICAL, "", 0, line, None,
                                   (type(exc), exc, exc.__traceback__) if exc is not None else None)
        print(JsonFormatter().format(record), file=sys.stderr)
        return 1
    if exc is not None:
        traceback.print_exception(exc, file=sys.stderr)
    print(f"{prog}: error: {line}", file=sys.stderr)
    return 1


def fail(prog: str, message: str, exc: BaseException | None = None, log_format: str = "text") -> NoReturn:
    """`report`, then exit 1."""
    sys.exit(report(prog, message, exc, log_format))
