"""The ``pipeline`` command in process (typer's CliRunner: no server, nothing sent) and its one error
line."""

from __future__ import annotations

from typer.testing import CliRunner, Result

import pipeline.cli as cli


def cli_run(*args: str) -> Result:
    return CliRunner().invoke(cli.app, list(args))


def error_line(result: Result) -> str:
    """The command's one error line; log lines (JSON) aside, stderr holds nothing else, and no
    exception escaped the command (a traceback would mean an unclassified error)."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if not line.startswith("{")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines
    return lines[0]
