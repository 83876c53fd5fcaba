"""Build one benchmark folder: the DuckDB source, the job file and the request files every client reads.

    python -m clients.prepare FOLDER --records N --concurrency C --base-url URL --model M

The source is the real Adzuna ads from ../shared, repeated under new ids (as pipeline.bench.datasets
does, plus company and location so the job's own user template applies). The prompt, schema and
request parameters are those of jobs/linkedin.yaml; the request bodies are built by `pipeline`'s own
code (PromptBuilder, LLMClient.request_body), so the other clients send byte-for-byte what it sends.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import duckdb
import yaml

from clients.common import PROMPT_FILE, RECORDS_FILE, REPO, REQUESTS_FILE, messages_for
from pipeline.extraction.prompt import PromptBuilder, client_settings
from pipeline.job.spec import load_job
from pipeline.servers.client import ChatRequest, LLMClient

ADZUNA = REPO.parent / "shared" / "datasets" / "adzuna_uk_jobs_2499.csv"
FIELDS = ["title", "company", "location", "description"]


def build_source(database: Path, count: int) -> None:
    with duckdb.connect(str(database)) as connection:
        if ADZUNA.is_file():
            connection.execute(
                "CREATE OR REPLACE TABLE postings AS WITH ads AS ("
                "SELECT row_number() OVER () - 1 AS n, Title AS title, Company AS company, "
                "LocationNormalized AS location, FullDescription AS description "
                f"FROM read_csv('{ADZUNA}', header = true, all_varchar = true)) "
                "SELECT i AS id, title, company, location, description FROM range($count) t(i) "
                "JOIN ads ON ads.n = i % (SELECT count(*) FROM ads) ORDER BY i",
                {"count": count},
            )
        else:
            connection.execute(
                "CREATE OR REPLACE TABLE postings AS SELECT i AS id, 'Engineer ' || i AS title, "
                "NULL::VARCHAR AS company, 'Leeds' AS location, "
                "repeat('We need SQL and Python. ', 60) AS description FROM range($count) t(i)",
                {"count": count},
            )


def write_job(folder: Path, base_url: str, model: str, concurrency: int) -> Path:
    job: dict[str, Any] = yaml.safe_load((REPO / "jobs" / "linkedin.yaml").read_text())
    # The other clients get a system prompt and a user template: the same requests without examples.
    job["prompt"].pop("examples_file", None)
    job.pop("variants", None)
    job.update(
        name="compare",
        database="source.duckdb",
        source={"table": "postings", "id_column": "id", "fields": FIELDS},
        schema="schemas.linkedin:JobPosting",
        model=model,
        endpoint={"base_url": base_url, "structured_output": True},
        concurrency=concurrency,
    )
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    folder: Path = args.folder
    build_source(folder / "source.duckdb", args.records)
    spec = load_job(write_job(folder, args.base_url, args.model, args.concurrency))
    prompts = PromptBuilder(spec)
    llm = LLMClient(client_settings(spec))
    fixed = llm.request_body(ChatRequest(messages=(), max_tokens=spec.max_tokens))
    fixed.pop("messages")
    prompt = {
        "system": prompts.system_message["content"],
        "user_template": spec.prompt.user,
        "fields": FIELDS,
        "body": fixed,  # model, max_tokens, temperature, reasoning_effort, response_format
        "schema_name": spec.schema_class.__name__,
        "json_schema": spec.schema_class.model_json_schema(),
        "retry": spec.retry.model_dump(mode="json"),
    }
    (folder / PROMPT_FILE).write_text(json.dumps(prompt))
    with (
        duckdb.connect(str(folder / "source.duckdb"), read_only=True) as connection,
        (folder / RECORDS_FILE).open("w", encoding="utf-8") as records,
        (folder / REQUESTS_FILE).open("w", encoding="utf-8") as requests,
    ):
        cursor = connection.execute(f"SELECT id, {', '.join(FIELDS)} FROM postings ORDER BY id")
        while batch := cursor.fetchmany(2000):
            for row in batch:
                fields = dict(zip(FIELDS, row[1:], strict=True))
                body = llm.request_body(prompts.request_for(fields))
                # The other clients build their messages from prompt.json; they must match pipeline's.
                if body["messages"] != messages_for(prompt, fields):
                    raise SystemExit(f"record {row[0]}: clients.common.messages_for differs from pipeline")
                records.write(json.dumps({"id": row[0], "fields": fields}) + "\n")
                requests.write(json.dumps({"id": row[0], "body": body}) + "\n")


if __name__ == "__main__":
    main()
