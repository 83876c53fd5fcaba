"""Each run keeps a profile of what it wrote and its time series, read back in run order; made by real
runs against scripted servers whose answers and usage are known exactly (tests/support/variants.py)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import orjson

from pipeline.job.spec import JobSpec
from pipeline.store.opening import open_job_output
from pipeline.store.run_profiles import stored_runs
from tests.support.jobs import table_rows
from tests.support.variants import (
    LATE_ID,
    big_answer,
    extraction,
    main_answer,
    make_postings,
    reply,
    run_variant,
    variants_job,
)


def runs_of(spec: JobSpec, most: int = 10) -> list[dict[str, object]]:
    connection = open_job_output(spec, [spec.output.runs_table])
    try:
        return stored_runs(connection, spec, most)
    finally:
        connection.close()


def test_a_run_keeps_the_profile_of_what_it_wrote(tmp_path: Path) -> None:
    spec = variants_job(tmp_path)
    summary = run_variant(spec, "main", main_answer)
    assert summary.drift == ()  # the first run has nothing to be compared with
    (run,) = runs_of(spec)
    profile = run["profile"]
    assert isinstance(profile, dict)
    # 9 results and record 9 schema-invalid; every reply 100 prompt, 40 completion, 10 reasoning tokens
    assert (profile["records"], profile["failed"], profile["attempted"]) == (9, 1, 10)
    assert profile["failures"] == {"schema_invalid": 1}
    # Per done record, every request counted (record 9's two too); each result took 100 (sd 0).
    assert profile["tokens"]["prompt"] == {"mean": 1100 / 9, "sd": 0.0}
    assert profile["tokens"]["reasoning"]["mean"] == 110 / 9
    assert profile["latency_s"]["p50"] is not None and profile["records_per_min"] > 0
    skills, title = profile["fields"]["skills"], profile["fields"]["title"]
    assert (skills["fill_rate"], skills["mean_length"]) == (1.0, 2.0)
    assert skills["grounded"] == {"found": 18, "values": 18, "share": 1.0}
    assert title["fill_rate"] == 1.0 and title["distinct"] == 9
    series = run["series"]
    assert isinstance(series, list) and series[-1]["done"] == 9


def test_a_profile_an_older_version_kept_reads_with_its_runs_tokens_per_done_record(tmp_path: Path) -> None:
    """A profile kept before had its results' own tokens (100: the failed record's requests left out):
    read back, it has its run's figure, as a new one does, so drift compares like with like."""
    spec = variants_job(tmp_path)
    run_variant(spec, "main", main_answer)
    (stored,) = table_rows(spec.database, "SELECT profile FROM runs")[0]
    older = orjson.loads(stored)
    older["tokens"] = {
        name: {"mean": mean, "sd": 0.0} for name, mean in (("prompt", 100.0), ("reasoning", 10.0))
    }
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute("UPDATE runs SET profile = ?", [orjson.dumps(older).decode()])
    (run,) = runs_of(spec)
    profile = run["profile"]
    assert isinstance(profile, dict)
    assert profile["tokens"]["prompt"] == {"mean": 1100 / 9, "sd": 0.0}
    assert profile["tokens"]["completion"] == {"mean": 440 / 9, "sd": None}  # no spread kept for it


def test_profiles_are_per_variant_and_in_run_order(tmp_path: Path) -> None:
    spec = variants_job(tmp_path)
    run_variant(spec, "main", main_answer)
    run_variant(spec, "big", big_answer)
    run_variant(spec, "main", main_answer, redo_stale=frozenset())  # nothing to do: a quiet run, no profile
    assert [run["run_id"] for run in runs_of(spec)] == [1]
    big = runs_of(spec.for_variant("big"))
    assert [run["run_id"] for run in big] == [2]
    profile = big[0]["profile"]
    assert isinstance(profile, dict) and profile["failures"] == {"truncated": 1}
    # record 1 took two requests, truncated record 8 one: 1,100 prompt tokens over 9 records done
    assert profile["tokens"]["prompt"]["mean"] == (100 * 8 + 200 + 100) / 9
    # the prompt's length: the 8 records answered on their first request, record 1 left out
    assert profile["prompt_length"] == {"mean": 100.0, "sd": 0.0, "records": 8}
    stored = table_rows(spec.database, "SELECT profile FROM runs WHERE run_id = 2")[0][0]
    assert orjson.loads(stored) == profile


def test_a_profile_counts_the_records_that_had_failed_before_the_run(tmp_path: Path) -> None:
    """What drift needs to leave a retry unjudged (a retried record is a hard one, not the usual input)."""
    spec = variants_job(tmp_path)
    run_variant(spec, "main", main_answer)  # record 9 fails for good
    make_postings(spec.database, [LATE_ID])
    run_variant(spec, "main", main_answer, retry_failed=True)  # 9 again (fails again) and the new 50
    run_variant(spec, "main", lambda number, attempt: reply(extraction(number)), only_failed=True)
    first, mixed, retry = (run["profile"] for run in runs_of(spec))
    assert isinstance(first, dict) and isinstance(mixed, dict) and isinstance(retry, dict)
    assert (first["attempted"], first["retried"]) == (10, 0)
    assert (mixed["attempted"], mixed["retried"]) == (2, 1)
    assert (retry["attempted"], retry["records"], retry["retried"]) == (1, 1, 1)
