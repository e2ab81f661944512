"""The flags and logs every command shares (vgpu_formats.cli)."""

from __future__ import annotations

import argparse
import json
import logging

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
