"""What every client shares: the job's prompt as exported by :mod:`clients.prepare`, and JSONL files.

Standard library only: the Curator client imports this from its own virtualenv.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

# Files clients.prepare writes into the benchmark folder.
PROMPT_FILE = "prompt.json"  # system message, user template, the fixed part of the request body
RECORDS_FILE = "records.jsonl"  # {"id": ..., "fields": {...}} per source record
REQUESTS_FILE = "requests.jsonl"  # {"id": ..., "body": {...}}: the exact body `pipeline run` posts


class _FieldValues(dict[str, Any]):
    """Template values as `pipeline run` formats them: a missing or null field reads as empty text."""

    def __missing__(self, key: str) -> str:
        return ""


def messages_for(prompt: Mapping[str, Any], fields: Mapping[str, Any]) -> list[dict[str, str]]:
    """The system message, then the user template filled with the record's fields."""
    values = _FieldValues({key: "" if value is None else str(value) for key, value in fields.items()})
    return [
        {"role": "system", "content": prompt["system"]},
        {"role": "user", "content": str(prompt["user_template"]).format_map(values)},
    ]


def load_prompt(folder: Path) -> dict[str, Any]:
    prompt: dict[str, Any] = json.loads((folder / PROMPT_FILE).read_text())
    return prompt


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)


def job_posting_model() -> Any:
    """``schemas.linkedin:JobPosting``, imported from the repository checkout."""
    if str(REPO) not in sys.path:
        sys.path.append(str(REPO))  # last: never in front of the running environment's own packages
    from schemas.linkedin import JobPosting

    return JobPosting
