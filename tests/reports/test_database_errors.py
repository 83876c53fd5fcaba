"""A DuckDB failure while a report reads the job's database is one line and exit 3, never a
traceback: every read goes through the DuckDB boundary (pipeline.source.db)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.job.spec import JobSpec
from tests.support.outputs import job_with_outputs


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> JobSpec:
    """Outputs whose columns have types the reports' queries cannot use (as a hand-edited table has)."""
    spec = job_with_outputs(tmp_path_factory.mktemp("broken"))
    with duckdb.connect(str(spec.database)) as connection:
        # failures: the raw answer, which the examples cut in SQL (the message is read whole)
        broken = (("runs", "done"), ("failures", "last_raw_output"), ("results", "total_latency_s"))
        for table, column in broken:
            connection.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
            connection.execute(f"ALTER TABLE {table} ADD COLUMN {column} BLOB")
    return spec


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["status", "--json"],
        ["failures"],
        ["eval", "--gold", "{gold}"],
        ["review", "--html", "{html}"],
    ],
)
def test_a_query_duckdb_refuses_is_one_line_and_exit_3(
    broken: JobSpec, tmp_path: Path, command: list[str]
) -> None:
    gold = tmp_path / "gold.jsonl"
    gold.write_text('{"id": 1, "title": "Data Engineer"}\n')
    args = [arg.format(gold=gold, html=tmp_path / "review.html") for arg in command]
    result = CliRunner().invoke(app, [args[0], str(broken.source_file), *args[1:]])
    assert result.exit_code == 3, result.output
    assert result.stderr.startswith(f"error: {broken.database}: DuckDB failed (")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
    assert not (tmp_path / "review.html").exists()
