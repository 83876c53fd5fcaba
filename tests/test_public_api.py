from __future__ import annotations

import pipeline


def test_public_api_is_pinned() -> None:
    assert sorted(pipeline.__all__) == [
        "BadOutputError",
        "ConfigError",
        "DatabaseLockedError",
        "EmptyOutputError",
        "FailureClass",
        "FatalRunError",
        "InvalidJSONError",
        "JobSpec",
        "JobStatus",
        "LoadReport",
        "PermanentRecordError",
        "PipelineError",
        "RecordError",
        "RunOptions",
        "RunStatus",
        "RunSummary",
        "SchemaInvalidError",
        "ServerUnreachableError",
        "TransientError",
        "TruncatedError",
        "job_status",
        "load_file",
        "load_job",
        "run_job",
        "run_job_locally",
    ]
    for name in pipeline.__all__:
        assert getattr(pipeline, name) is not None


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
