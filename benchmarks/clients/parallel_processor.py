"""Client (c): a parallel request processor in the style of the OpenAI cookbook's
``api_request_parallel_processor.py`` (written for this benchmark, not copied).

Reads request bodies lazily from a JSONL file, tracks request and token capacity per minute, launches
one request per loop turn (sleeping 1 ms between turns), POSTs with one aiohttp session, puts a failed
request back on a retry queue until its attempts run out, and appends each outcome to a JSONL file as
it arrives. Two additions the cookbook lacks and this benchmark needs: a cap of ``max_in_flight``
requests (the cookbook only has rate limits), sized into the aiohttp connector whose default limit of
100 connections would silently cap the concurrency; and Pydantic validation of each answer, a failure
of which counts as an error and is retried like any other.

    python -m clients.parallel_processor REQUESTS.jsonl --base-url URL --out results.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from clients.common import job_posting_model

SECONDS_TO_PAUSE_AFTER_RATE_LIMIT_ERROR = 15.0
SECONDS_TO_SLEEP_EACH_LOOP = 0.001  # as the cookbook: one launch per turn, at most ~1,000 per second


@dataclass
class StatusTracker:
    tasks_started: int = 0
    tasks_in_progress: int = 0  # started and not finished: in flight or waiting to be retried
    requests_in_flight: int = 0
    tasks_succeeded: int = 0
    tasks_failed: int = 0
    rate_limit_errors: int = 0
    api_errors: int = 0
    other_errors: int = 0
    time_of_last_rate_limit_error: float = 0.0


@dataclass
class APIRequest:
    task_id: int
    record_id: Any
    request_json: dict[str, Any]
    token_consumption: int
    attempts_left: int
    errors: list[str] = field(default_factory=list)

    async def call_api(
        self,
        session: aiohttp.ClientSession,
        url: str,
        retry_queue: asyncio.Queue[APIRequest],
        save_path: Path,
        status: StatusTracker,
        model: Any,
    ) -> None:
        error: str | None = None
        extracted: dict[str, Any] | None = None
        status.requests_in_flight += 1
        try:
            async with session.post(url, json=self.request_json) as response:
                payload = await response.json(content_type=None)
            if "error" in payload:
                status.api_errors += 1
                error = str(payload["error"])[:300]
                if response.status == 429 or "rate limit" in error.lower():
                    status.time_of_last_rate_limit_error = time.time()
                    status.rate_limit_errors += 1
            else:
                content = payload["choices"][0]["message"]["content"]
                extracted = model.model_validate_json(content or "").model_dump(mode="json")
        except Exception as exc:  # connection errors, malformed bodies, validation errors
            status.other_errors += 1
            error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            status.requests_in_flight -= 1
        if error is not None:
            self.errors.append(error)
            if self.attempts_left:
                retry_queue.put_nowait(self)
                return
            append_to_jsonl({"id": self.record_id, "errors": self.errors}, save_path)
            status.tasks_in_progress -= 1
            status.tasks_failed += 1
            return
        append_to_jsonl({"id": self.record_id, "extracted": extracted}, save_path)
        status.tasks_in_progress -= 1
        status.tasks_succeeded += 1


def append_to_jsonl(data: dict[str, Any], path: Path) -> None:
    with path.open("a", encoding="utf-8") as file:
        file.write(json.dumps(data) + "\n")


def token_consumption(request_json: dict[str, Any]) -> int:
    """Prompt tokens (about 4 characters each) plus the completion budget, as the cookbook counts."""
    characters = sum(len(message["content"]) for message in request_json["messages"])
    return characters // 4 + int(request_json.get("max_tokens") or 0)


async def process_api_requests_from_file(
    requests_path: Path,
    save_path: Path,
    request_url: str,
    max_requests_per_minute: float,
    max_tokens_per_minute: float,
    max_in_flight: int,
    max_attempts: int,
) -> StatusTracker:
    model = job_posting_model()
    retry_queue: asyncio.Queue[APIRequest] = asyncio.Queue()
    status = StatusTracker()
    tasks: set[asyncio.Task[None]] = set()
    next_request: APIRequest | None = None
    available_request_capacity = max_requests_per_minute
    available_token_capacity = max_tokens_per_minute
    last_update_time = time.time()
    file_not_finished = True
    connector = aiohttp.TCPConnector(limit=max_in_flight)
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        with requests_path.open(encoding="utf-8") as file:
            lines = iter(file)  # read lazily: only what is about to be sent is in memory
            while True:
                if next_request is None:
                    if not retry_queue.empty():
                        next_request = retry_queue.get_nowait()
                    elif file_not_finished:
                        try:
                            line = json.loads(next(lines))
                        except StopIteration:
                            file_not_finished = False
                        else:
                            next_request = APIRequest(
                                task_id=status.tasks_started,
                                record_id=line["id"],
                                request_json=line["body"],
                                token_consumption=token_consumption(line["body"]),
                                attempts_left=max_attempts,
                            )
                            status.tasks_started += 1
                            status.tasks_in_progress += 1

                now = time.time()
                elapsed = now - last_update_time
                available_request_capacity = min(
                    available_request_capacity + max_requests_per_minute * elapsed / 60.0,
                    max_requests_per_minute,
                )
                available_token_capacity = min(
                    available_token_capacity + max_tokens_per_minute * elapsed / 60.0,
                    max_tokens_per_minute,
                )
                last_update_time = now

                if (
                    next_request is not None
                    and len(tasks) < max_in_flight  # tasks not finished, whether waiting or reading
                    and available_request_capacity >= 1
                    and available_token_capacity >= next_request.token_consumption
                ):
                    available_request_capacity -= 1
                    available_token_capacity -= next_request.token_consumption
                    next_request.attempts_left -= 1
                    task = asyncio.create_task(
                        next_request.call_api(session, request_url, retry_queue, save_path, status, model)
                    )
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    next_request = None

                if status.tasks_in_progress == 0:
                    break

                await asyncio.sleep(SECONDS_TO_SLEEP_EACH_LOOP)

                since_rate_limit = time.time() - status.time_of_last_rate_limit_error
                if since_rate_limit < SECONDS_TO_PAUSE_AFTER_RATE_LIMIT_ERROR:
                    await asyncio.sleep(SECONDS_TO_PAUSE_AFTER_RATE_LIMIT_ERROR - since_rate_limit)
    return status


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("requests", type=Path)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-requests-per-minute", type=float, default=1e7)
    parser.add_argument("--max-tokens-per-minute", type=float, default=1e10)
    parser.add_argument("--max-in-flight", type=int, default=256)
    parser.add_argument("--max-attempts", type=int, default=5)
    args = parser.parse_args()
    args.out.unlink(missing_ok=True)
    status = asyncio.run(
        process_api_requests_from_file(
            args.requests,
            args.out,
            args.base_url.rstrip("/") + "/chat/completions",
            args.max_requests_per_minute,
            args.max_tokens_per_minute,
            args.max_in_flight,
            args.max_attempts,
        )
    )
    print(json.dumps(status.__dict__))


if __name__ == "__main__":
    main()
