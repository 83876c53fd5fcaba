"""``pipeline status`` as a person or a script reads it: a real process, its text and its JSON."""

from __future__ import annotations

from pathlib import Path

import duckdb
import orjson

from tests.support.outputs import job_with_outputs
from tests.support.processes import run_pipeline


def test_a_missing_source_table_is_one_plain_line_and_no_nulls(tmp_path: Path) -> None:
    spec = job_with_outputs(tmp_path)
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute("DROP TABLE postings")
    text = run_pipeline("status", str(spec.source_file))
    assert text.returncode == 0, text.stderr
    assert "None" not in text.stdout and "ETA" not in text.stdout
    lines = text.stdout.splitlines()
    assert lines[1] == (
        f"source:   {spec.source_file}: source in {spec.database}: table 'postings' does not exist "
        f"(key source.table); load records with `pipeline load FILE --job {spec.source_file}`"
    )
    assert lines[2].startswith("results:  5 stored")
    assert lines[3] == "failed:   7 (invalid_json 3, permanent 1, schema_invalid 2, truncated 1)"
    report = orjson.loads(run_pipeline("status", str(spec.source_file), "--json").stdout)
    assert "table 'postings' does not exist" in report["source_problem"]
    assert report["results"] == 5 and sum(report["failed"].values()) == 7
    assert not {"source_records", "done", "pending", "stale", "eta_s"} & set(report)
