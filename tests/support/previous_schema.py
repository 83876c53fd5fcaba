"""A job database as the previous version wrote it (results keyed by record alone, no version key,
tokens of the successful attempt only), for the migration tests."""

from __future__ import annotations

from pathlib import Path

import duckdb

# The output tables exactly as pipeline/store.py created them before versioned results.
PREVIOUS_DDL = """
CREATE TABLE runs (
    run_id INTEGER PRIMARY KEY, job_name VARCHAR, job_hash VARCHAR, model VARCHAR,
    base_url VARCHAR, concurrency INTEGER, started_at TIMESTAMP, updated_at TIMESTAMP,
    ended_at TIMESTAMP, status VARCHAR, pending_at_start BIGINT, done BIGINT DEFAULT 0,
    failed BIGINT DEFAULT 0, attempts BIGINT DEFAULT 0, prompt_tokens BIGINT DEFAULT 0,
    completion_tokens BIGINT DEFAULT 0, message VARCHAR);
CREATE TABLE results (
    record_id BIGINT PRIMARY KEY, run_id INTEGER, extracted JSON, model VARCHAR,
    attempts INTEGER, prompt_tokens INTEGER, completion_tokens INTEGER, reasoning_tokens INTEGER,
    latency_s DOUBLE, finish_reason VARCHAR, prompt_hash VARCHAR, schema_hash VARCHAR,
    created_at TIMESTAMP DEFAULT (timezone('UTC', now())));
CREATE TABLE failures (
    record_id BIGINT PRIMARY KEY, run_id INTEGER, failure_class VARCHAR, message VARCHAR,
    attempts INTEGER, last_raw_output VARCHAR, created_at TIMESTAMP DEFAULT (timezone('UTC', now())));
"""


def write_previous_database(database: Path, *, done: range, failed: range) -> None:
    """Output tables of the previous layout: one completed run, ``done`` results, ``failed`` failures
    (schema_invalid). The source table must exist already."""
    with duckdb.connect(str(database)) as connection:
        connection.execute(PREVIOUS_DDL)
        connection.execute(
            "INSERT INTO runs VALUES (1, 'test', 'oldhash', 'test-model', 'http://old/v1', 8, "
            "now(), now(), now(), 'completed_with_failures', ?, ?, ?, ?, ?, ?, NULL)",
            [len(done) + len(failed), len(done), len(failed), len(done) + 3 * len(failed), 100, 40],
        )
        connection.execute(
            "INSERT INTO results (record_id, run_id, extracted, model, attempts, prompt_tokens, "
            "completion_tokens, reasoning_tokens, latency_s, finish_reason, prompt_hash, schema_hash) "
            "SELECT i, 1, json_object('title', 'old ' || i, 'skills', []), 'test-model', 1, 100, 40, 10, "
            f"0.5, 'stop', 'p', 's' FROM range({done.start}, {done.stop}) t(i)"
        )
        connection.execute(
            "INSERT INTO failures (record_id, run_id, failure_class, message, attempts, last_raw_output) "
            "SELECT i, 1, 'schema_invalid', 'low is larger than high', 3, '{}' "
            f"FROM range({failed.start}, {failed.stop}) t(i)"
        )
