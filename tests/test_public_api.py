from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import pipeline
from tests.support.jobs import make_job, table_rows
from tests.support.variants import PARTIAL_GOLD, two_variant_job, write_gold


def test_public_api_is_pinned() -> None:
    assert sorted(pipeline.__all__) == [
        "BadOutputError",
        "CompareReport",
        "CompareSettings",
        "ConfigError",
        "DatabaseLockedError",
        "EmptyOutputError",
        "EvalReport",
        "EvalSettings",
        "ExportFormat",
        "ExportReport",
        "FailureClass",
        "FailureReport",
        "FatalRunError",
        "InvalidJSONError",
        "JobSpec",
        "JobStatus",
        "LoadReport",
        "PairedEvalReport",
        "PermanentRecordError",
        "PipelineError",
        "RecordError",
        "ReviewPage",
        "RunOptions",
        "RunStatus",
        "RunSummary",
        "RunsReport",
        "Sample",
        "SchemaInvalidError",
        "ServerUnreachableError",
        "TransientError",
        "TruncatedError",
        "compare_page",
        "compare_variants",
        "evaluate",
        "evaluate_pair",
        "export_results",
        "failure_report",
        "job_status",
        "load_job",
        "load_source",
        "review_page",
        "run_job",
        "run_job_locally",
        "run_job_sync",
        "runs_page",
        "runs_report",
    ]
    for name in pipeline.__all__:
        assert getattr(pipeline, name) is not None


def test_public_names_are_imported_lazily_from_where_they_live() -> None:
    """``pipeline/__init__.py`` maps each name to its module (PEP 562): the map, ``__all__`` and
    ``dir()`` agree, and a name is the object its module defines."""
    assert sorted(pipeline._PUBLIC) == sorted(pipeline.__all__)
    assert set(pipeline.__all__) <= set(dir(pipeline))
    assert pipeline.ReviewPage is importlib.import_module("pipeline.reports.review_page").ReviewPage
    from pipeline import run_job
    from pipeline.run.runner import run_job as defined

    assert run_job is defined
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        _ = pipeline.no_such_name


def test_error_tree_by_reaction() -> None:
    assert issubclass(pipeline.ConfigError, pipeline.FatalRunError)
    assert issubclass(pipeline.DatabaseLockedError, pipeline.FatalRunError)
    for bad_output in (
        pipeline.InvalidJSONError,
        pipeline.SchemaInvalidError,
        pipeline.EmptyOutputError,
        pipeline.TruncatedError,
    ):
        assert issubclass(bad_output, pipeline.BadOutputError)
    for record_level in (pipeline.TransientError, pipeline.BadOutputError, pipeline.PermanentRecordError):
        assert issubclass(record_level, pipeline.RecordError)
        assert not issubclass(record_level, pipeline.FatalRunError)
    assert issubclass(pipeline.ServerUnreachableError, pipeline.TransientError)


def test_every_reading_command_is_one_call_taking_plain_paths(tmp_path: Path) -> None:
    spec = two_variant_job(tmp_path)  # real runs of variants main and big
    gold = str(write_gold(tmp_path / "gold.jsonl", PARTIAL_GOLD))
    assert pipeline.job_status(spec).done == 9
    assert pipeline.failure_report(spec).total == 1
    assert pipeline.evaluate(spec, gold).agreement.records_scored == 3
    assert pipeline.evaluate_pair(spec, gold, ("main", "big")).records == 3
    compared = pipeline.compare_variants(spec, "main", "big", pipeline.CompareSettings())
    assert (compared.reference, compared.candidate, compared.attempted) == ("main", "big", 10)
    assert [run["run_id"] for run in pipeline.runs_report(spec).runs] == [1]
    exported = pipeline.export_results(spec, str(tmp_path / "main.jsonl"))
    assert (exported.format, exported.rows) == (pipeline.ExportFormat.JSONL, 9)
    assert len((tmp_path / "main.jsonl").read_text().splitlines()) == 9


def test_every_page_is_one_call_writing_the_file_it_is_given(tmp_path: Path) -> None:
    spec = two_variant_job(tmp_path)  # real runs of variants main and big
    review = pipeline.review_page(spec, str(tmp_path / "review.html"), ("main", "big"), pipeline.Sample(4, 7))
    assert (review.variants, len(review.records)) == (("main", "big"), 4)
    compared = pipeline.compare_page(spec, tmp_path / "ab.html", "main", "big")
    assert compared.attempted == 10 and compared.review is not None
    assert compared.review.comparison is not None and compared.review.comparison["records"] == 8
    runs = pipeline.runs_page(spec, tmp_path / "runs.html", runs=5)
    assert [run["run_id"] for run in runs.runs] == [1]
    for name, data_id in [("review", "review-data"), ("ab", "review-data"), ("runs", "report-data")]:
        page = (tmp_path / f"{name}.html").read_text()
        assert page.startswith("<!DOCTYPE html>") and f'id="{data_id}"' in page


def test_load_takes_the_job_and_a_file_and_no_database_object(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=0)
    postings = tmp_path / "postings.csv"
    postings.write_text("id,title,description\n1,Chef,Cooks\n2,Baker,Bakes\n")
    loaded = pipeline.load_source(spec, str(postings))
    assert (loaded.rows_in_file, loaded.inserted, loaded.updated) == (2, 2, 0)
    assert table_rows(spec.database, "SELECT id, title FROM postings ORDER BY id") == [
        (1, "Chef"),
        (2, "Baker"),
    ]
