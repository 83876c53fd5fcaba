"""Client (d): Bespoke Curator (``bespokelabs-curator``), run from its own virtualenv.

A ``curator.LLM`` subclass whose ``prompt`` returns the job's messages and whose ``parse`` keeps the
validated ``JobPosting``; backend "openai" pointed at the simulator, with the concurrency and
effectively no rate limits. Results (and Curator's failed requests) are written to one JSONL file.

    python -m clients.curator_client FOLDER --base-url URL --concurrency 256 --out results.jsonl

Run it with TIKTOKEN_CACHE_DIR holding cl100k_base (Curator downloads it otherwise), DO_NOT_TRACK=1 and
CURATOR_CACHE_DIR pointing at an empty folder (Curator would return a cached run instantly).
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path
from typing import Any

from clients.common import RECORDS_FILE, job_posting_model, load_prompt, messages_for, read_jsonl


def run(folder: Path, base_url: str, concurrency: int, out: Path) -> None:
    curator: Any = importlib.import_module("bespokelabs.curator")  # only in Curator's virtualenv
    prompt = load_prompt(folder)
    body = prompt["body"]
    fields = prompt["fields"]
    JobPosting = job_posting_model()

    class Extract(curator.LLM):  # type: ignore[misc]  # curator is loaded at run time, so its class is Any here
        def prompt(self, row: dict[str, Any]) -> list[dict[str, str]]:
            return messages_for(prompt, {name: row[name] for name in fields})

        def parse(self, row: dict[str, Any], response: Any) -> dict[str, Any]:
            return {"id": row["id"], "extracted": response.model_dump(mode="json")}

    rows = [{"id": record["id"], **record["fields"]} for record in read_jsonl(folder / RECORDS_FILE)]
    extract = Extract(
        model_name=body["model"],
        backend="openai",
        response_format=JobPosting,
        generation_params={
            "max_tokens": body["max_tokens"],
            "temperature": body["temperature"],
            "reasoning_effort": body["reasoning_effort"],
        },
        backend_params={
            "base_url": base_url,
            "api_key": "EMPTY",
            "max_concurrent_requests": concurrency,
            "max_requests_per_minute": 10**7,
            "max_tokens_per_minute": 10**10,
            "request_timeout": 900,
            "require_all_responses": False,
        },
    )
    response = extract(rows)
    with out.open("w", encoding="utf-8") as lines:
        for row in response.dataset:
            lines.write(json.dumps({"id": row["id"], "extracted": row["extracted"]}) + "\n")
        for failed in response.get_failed_requests():
            original = failed.get("original_row") or {}
            lines.write(json.dumps({"id": original.get("id"), "error": "failed in Curator"}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    run(args.folder, args.base_url, args.concurrency, args.out)


if __name__ == "__main__":
    main()
