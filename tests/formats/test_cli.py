"""The flags and logs every command shares (vgpu_formats.cli)."""

from __future__ import annotations

import argparse
import json
import logging
import sys

import pytest
from vgpu_formats import cli


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tool")
    cli.add_common_flags(parser)
    return parser


def test_common_flags_and_their_levels() -> None:
    parse = _parser().parse_args
    assert cli.log_level(parse([])) == logging.INFO
    assert cli.log_level(parse(["-v"])) == cli.log_level(parse(["--verbose"])) == logging.DEBUG
    assert cli.log_level(parse(["--log-level", "error"])) == logging.ERROR
    assert parse(["--log-format", "json"]).log_format == "json"


def test_version_names_the_program(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        _parser().parse_args(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"tool {cli.version()}"


def test_json_lines_carry_the_extra_fields() -> None:
    record = logging.LogRecord("vgpu.x", logging.WARNING, __file__, 1, "wrote %s", ("cm",), None)
    record.action = "updated"
    entry = json.loads(cli.JsonFormatter().format(record))
    assert entry["message"] == "wrote cm" and entry["severity"] == "warn" and entry["logger"] == "vgpu.x"
    assert entry["action"] == "updated" and "timestamp" in entry and "args" not in entry


def test_json_lines_read_like_kopfs() -> None:
    """What kopf's object loggers put on a record (the demo runs kopf under this formatter): the
    reference under kopf's JSON key, not its settings or Event flag; a traceback under kopf's key;
    an extra named like a base field does not replace it."""
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("kopf.objects", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    ref = {"kind": "VGPUPolicy", "name": "default"}
    for key, value in {"settings": "OperatorSettings(" + "x" * 2000 + ")", "k8s_skip": False, "k8s_ref": ref,
                       "message": "forged", "severity": "debug", "logger": "x", "timestamp": "never"}.items():
        setattr(record, key, value)
    entry = json.loads(cli.JsonFormatter().format(record))
    assert entry[cli.REFKEY] == ref and cli.REFKEY == "object"
    assert not {"settings", "k8s_skip", "k8s_ref", "exception"} & entry.keys()
    assert (entry["message"], entry["severity"], entry["logger"]) == ("failed", "error", "kopf.objects")
    assert entry["timestamp"] != "never"
    assert "ValueError: boom" in entry[cli.EXCEPTION_KEY] and cli.EXCEPTION_KEY == "exc_info"


def test_configure_logging_keeps_other_handlers(caplog: pytest.LogCaptureFixture) -> None:
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        cli.configure_logging(logging.INFO, "text")
        cli.configure_logging(logging.INFO, "json")  # a second main() in one process: still one of ours
        ours = [h for h in root.handlers if h not in before]
        assert len(ours) == 1 and isinstance(ours[0].formatter, cli.JsonFormatter)
        logging.getLogger("vgpu.test").info("seen by pytest too")
        assert "seen by pytest too" in caplog.text
    finally:
        for handler in [h for h in root.handlers if h not in before]:
            root.removeHandler(handler)


def test_report_is_one_line_in_argparse_form(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.report("tool", "no kubeconfig:\n  pass --kubeconfig") == 1
    assert capsys.readouterr().err == "tool: error: no kubeconfig: pass --kubeconfig\n"
    with pytest.raises(SystemExit) as exited:
        cli.fail("tool", "broken")
    assert exited.value.code == 1


def test_report_in_json_is_one_fatal_record(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.report("tool", "no kubeconfig:\n  pass --kubeconfig", log_format="json") == 1
    [line] = capsys.readouterr().err.splitlines()
    entry = json.loads(line)
    assert (entry["severity"], entry["logger"], entry["message"]) == ("fatal", "tool",
                                                                      "no kubeconfig: pass --kubeconfig")
    assert cli.EXCEPTION_KEY not in entry
    try:
        raise OSError("refused")
    except OSError as exc:
        caught = exc
    with pytest.raises(SystemExit):
        cli.fail("tool", "broken", caught, "json")  # --log-level debug: the traceback as a field
    [line] = capsys.readouterr().err.splitlines()
    entry = json.loads(line)
    assert entry["message"] == "broken" and "OSError: refused" in entry[cli.EXCEPTION_KEY]
