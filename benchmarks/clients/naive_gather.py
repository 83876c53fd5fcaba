"""Client (b): what a competent user writes first. ``asyncio.gather`` over every record, an
``asyncio.Semaphore`` for the concurrency, ``AsyncOpenAI.chat.completions.create`` with the SDK's
default retries (max_retries=2, its own backoff) and timeout, Pydantic validation of each answer, and
the results written to JSONL at the end.

    python -m clients.naive_gather FOLDER --base-url URL --concurrency 256 --out results.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from clients.common import RECORDS_FILE, job_posting_model, load_prompt, messages_for, read_jsonl


async def run(folder: Path, base_url: str, concurrency: int, out: Path) -> None:
    prompt = load_prompt(folder)
    body = prompt["body"]
    JobPosting = job_posting_model()
    records = list(read_jsonl(folder / RECORDS_FILE))
    client = AsyncOpenAI(base_url=base_url, api_key="EMPTY")
    semaphore = asyncio.Semaphore(concurrency)

    async def extract(record: dict[str, Any]) -> dict[str, Any]:
        async with semaphore:
            try:
                response = await client.chat.completions.create(
                    model=body["model"],
                    messages=messages_for(prompt, record["fields"]),  # type: ignore[arg-type]  # plain dicts: the SDK types each role's message as a TypedDict
                    max_tokens=body["max_tokens"],
                    temperature=body["temperature"],
                    reasoning_effort=body["reasoning_effort"],
                    response_format=body["response_format"],
                )
                posting = JobPosting.model_validate_json(response.choices[0].message.content or "")
                return {"id": record["id"], "extracted": posting.model_dump(mode="json")}
            except Exception as exc:
                return {"id": record["id"], "error": f"{type(exc).__name__}: {exc}"[:500]}

    outcomes = await asyncio.gather(*(extract(record) for record in records))
    await client.close()
    with out.open("w", encoding="utf-8") as lines:
        for outcome in outcomes:
            lines.write(json.dumps(outcome) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    asyncio.run(run(args.folder, args.base_url, args.concurrency, args.out))


if __name__ == "__main__":
    main()
