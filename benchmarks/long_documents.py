"""Documents longer than the context, on the bundled model: chunking (1 and 2 passes) against the whole
document, by recall, precision and F1 of skills and knowledge, and by the requests and tokens spent.

Each document is a run of consecutive SkillSpan sentences (read from ../shared/datasets/skillspan and
converted by pipeline.bench.skillspan: nothing of the dataset is copied into the repository), long
enough to be past the bundled model's context (8,192 tokens); its gold is the union of its sentences'
skills and knowledge. Every option runs jobs/skillspan.yaml (its few-shot prompt, worded for passages
instead of single sentences, with schemas.skillspan:DocumentSkillMentions, whose lists have room for a
document) on the same documents against the bundled local vLLM server, each in a database of its own:

* whole, context 8,192: chunking off: every document is too_long, and nothing is sent;
* whole, context 32,768: chunking off, the server started with --max-model-len 32768 (past the 8,192
  positions SmolLM2-135M was trained on, which vLLM allows with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1);
* chunks, 1 pass and 2 passes: chunking auto at 8,192 (what the context leaves after max_tokens and
  the prompt), 100 tokens of overlap; and chunks of 500 tokens (50 of overlap), 1 and 2 passes, the
  size a small model reads best (the sentence-level job sends ~40 tokens of text a request).

Scores are micro over every document (a document without a result finds nothing) with the eval's own
matching (normalised text, one to one). Prints one table.

    .venv/bin/python benchmarks/long_documents.py [--documents 4] [--tokens 11000] [--options all]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import duckdb
import orjson
from support import REPO

sys.path.insert(0, str(REPO))  # this checkout's pipeline, whichever one the venv installed

from pipeline.bench.skillspan import is_skipped, read_conll
from pipeline.errors import FailureClass
from pipeline.job.spec import JobSpec, load_job
from pipeline.local import LocalServerOptions
from pipeline.quality.matching import list_scores
from pipeline.reports.evaluation import EvalSettings, evaluate
from pipeline.run.progress import LogProgress
from pipeline.run.runner import RunOptions, run_job_locally

DATASET = REPO.parent / "shared" / "datasets" / "skillspan"
FILES = ("skillspan_house_dev.conll", "skillspan_tech_dev.conll")
CHARS_PER_TOKEN = 4.0  # SmolLM2 on this English text, about: sizes documents, the run counts exactly
FIELDS = ("skills", "knowledge")
SYSTEM = (
    "You annotate passages from English job postings with the skills and the knowledge they ask of a "
    "candidate, following the SkillSpan guidelines (Zhang et al., 2022). Your spans are compared word "
    "for word with human annotations."
)


@dataclass(frozen=True, slots=True)
class Document:
    id: str
    text: str
    gold: dict[str, list[str]]


@dataclass(frozen=True, slots=True)
class Option:
    name: str
    chunking: dict[str, Any] | None
    max_model_len: int = 8192


OPTIONS = (
    Option("whole, context 8,192", None),
    Option("chunks (auto), 1 pass", {"field": "text", "overlap_tokens": 100, "passes": 1}),
    Option("chunks (auto), 2 passes", {"field": "text", "overlap_tokens": 100, "passes": 2}),
    Option("whole, context 32,768", None, max_model_len=32768),
    Option("chunks of 500 tokens, 1 pass", {"field": "text", "max_chunk_tokens": 500, "overlap_tokens": 50}),
    Option(
        "chunks of 500 tokens, 2 passes",
        {"field": "text", "max_chunk_tokens": 500, "overlap_tokens": 50, "passes": 2},
    ),
)


@dataclass(slots=True)
class Outcome:
    option: Option
    done: int = 0
    too_long: int = 0
    other_failures: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    values: int = 0  # in the merged results (chunked ones: what their passes found first)
    later_passes: int = 0  # of those, what passes after the first added
    seconds: float = 0.0
    counts: dict[str, list[int]] = field(default_factory=lambda: {name: [0, 0, 0] for name in FIELDS})

    def scores(self, name: str) -> tuple[float, float, float]:
        """Micro precision, recall, F1 of one field over every document, as the eval pools them."""
        tp, fp, fn = self.counts[name]
        pooled = list_scores(tp, reference_items=tp + fn, candidate_items=tp + fp)
        return pooled.precision, pooled.recall, pooled.f1


def documents(count: int, tokens: int) -> list[Document]:
    """Runs of consecutive sentences of the dev files, each about ``tokens`` long, in file order."""
    found: list[Document] = []
    for name in FILES:
        sentences = [
            sentence
            for posting in read_conll(DATASET / name, lenient=True).postings
            for sentence in posting
            if not is_skipped(sentence.tokens)
        ]
        taken: list[Any] = []
        for sentence in sentences:
            taken.append(sentence)
            if sum(len(" ".join(s.tokens)) + 1 for s in taken) >= tokens * CHARS_PER_TOKEN:
                found.append(_document(f"{name.split('_')[1]}-{len(found):03d}", taken))
                taken = []
            if len(found) == count:
                return found
    return found


def _document(key: str, sentences: Sequence[Any]) -> Document:
    gold = {
        "skills": list(dict.fromkeys(span for sentence in sentences for span in sentence.skills)),
        "knowledge": list(dict.fromkeys(span for sentence in sentences for span in sentence.knowledge)),
    }
    return Document(key, "\n".join(" ".join(sentence.tokens) for sentence in sentences), gold)


def job(folder: Path, option: Option) -> JobSpec:
    base = load_job(REPO / "jobs" / "skillspan.yaml")
    rules = base.prompt.system.split("\n\n", 1)[1]  # the job's guidelines, after its first paragraph
    prompt = {"system": f"{SYSTEM}\n\n{rules}", "user": "Text: {text}"}
    return base.with_overrides(
        database=folder / "docs.duckdb",
        schema="schemas.skillspan:DocumentSkillMentions",
        prompt=prompt,
        concurrency=4,
        chunking=option.chunking,
    )


def prepare(folder: Path, docs: Sequence[Document]) -> Path:
    folder.mkdir(parents=True)
    with duckdb.connect(str(folder / "docs.duckdb")) as connection:
        connection.execute("CREATE TABLE sentences (id VARCHAR, text VARCHAR)")
        connection.executemany("INSERT INTO sentences VALUES (?, ?)", [[doc.id, doc.text] for doc in docs])
    gold = folder / "gold.jsonl"
    gold.write_bytes(b"".join(orjson.dumps({"id": doc.id, **doc.gold}) + b"\n" for doc in docs))
    return gold


async def run_option(folder: Path, option: Option, docs: Sequence[Document]) -> Outcome:
    gold = prepare(folder, docs)
    spec = job(folder, option)
    if option.max_model_len > 8192:  # SmolLM2 was trained on 8,192 positions: vLLM asks to be told
        os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
    server = LocalServerOptions(max_model_len=option.max_model_len, max_num_seqs=8)
    began = time.perf_counter()
    summary = await run_job_locally(spec, RunOptions(progress=LogProgress(interval_s=60)), server)
    outcome = Outcome(option, seconds=time.perf_counter() - began)
    _spent(outcome, spec)
    _scored(outcome, spec, gold, docs)
    assert outcome.done == summary.done, (outcome.done, summary)
    return outcome


def _spent(outcome: Outcome, spec: JobSpec) -> None:
    with duckdb.connect(str(spec.database), read_only=True) as connection:
        totals = connection.execute(
            "SELECT sum(attempts), sum(prompt_tokens), sum(completion_tokens) FROM runs"
        ).fetchone()
        failures = connection.execute("SELECT failure_class, count(*) FROM failures GROUP BY 1").fetchall()
        [(done,)] = connection.execute("SELECT count(*) FROM results").fetchall()
        outcome.done = int(done)
        results = connection.execute("SELECT extracted, chunks FROM results").fetchall()
    for extracted, chunks in results:
        added = orjson.loads(chunks)["added"] if chunks else {}
        outcome.values += sum(len(orjson.loads(extracted)[name]) for name in FIELDS)
        outcome.later_passes += sum(count for number, count in added.items() if number != "1")
    outcome.requests, outcome.prompt_tokens, outcome.completion_tokens = (
        int(v or 0) for v in totals or (0, 0, 0)
    )
    for failure_class, count in failures:
        if failure_class == FailureClass.TOO_LONG:
            outcome.too_long += int(count)
        else:
            outcome.other_failures += int(count)


def _scored(outcome: Outcome, spec: JobSpec, gold: Path, docs: Sequence[Document]) -> None:
    """The eval's counts over the documents with a result; every gold value of the others is missed."""
    scored: set[str] = set()
    if outcome.done:
        report = evaluate(spec, gold, EvalSettings(fields=FIELDS))
        by_path = {score.path: score for score in report.agreement.fields}
        for name in FIELDS:
            score = by_path[name]
            outcome.counts[name] = [score.true_positives, score.false_positives, score.false_negatives]
        scored = {record.record_id for record in report.agreement.records}
    for doc in docs:
        if doc.id not in scored:
            for name in FIELDS:
                outcome.counts[name][2] += len(doc.gold[name])


def table(outcomes: Sequence[Outcome], docs: Sequence[Document]) -> str:
    lines = [
        "| option | done | too_long | other failures | requests | prompt tokens | completion tokens | "
        "values (later passes) | skills P / R / F1 | knowledge P / R / F1 | minutes |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for outcome in outcomes:
        fields = [" / ".join(f"{value:.3f}" for value in outcome.scores(name)) for name in FIELDS]
        lines.append(
            f"| {outcome.option.name} | {outcome.done} of {len(docs)} | {outcome.too_long} | "
            f"{outcome.other_failures} | {outcome.requests:,} | {outcome.prompt_tokens:,} | "
            f"{outcome.completion_tokens:,} | {outcome.values:,} (+{outcome.later_passes:,}) | {fields[0]} | "
            f"{fields[1]} | {outcome.seconds / 60:.1f} |"
        )
    return "\n".join(lines)


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--documents", type=int, default=4, help="At most (the dev files hold 4 at 11k).")
    parser.add_argument("--tokens", type=int, default=11000, help="About how long each document is.")
    parser.add_argument("--options", default="all", help="Comma-separated option numbers (1-6), or all.")
    parser.add_argument("--keep", type=Path, help="Keep each option's database in this folder.")
    args = parser.parse_args(argv)
    docs = documents(args.documents, args.tokens)
    chosen = OPTIONS if args.options == "all" else [OPTIONS[int(n) - 1] for n in args.options.split(",")]
    lengths = [len(doc.text) for doc in docs]
    print(
        f"{len(docs)} documents of {min(lengths):,} to {max(lengths):,} characters; gold: "
        f"{sum(len(doc.gold['skills']) for doc in docs):,} skills, "
        f"{sum(len(doc.gold['knowledge']) for doc in docs):,} knowledge spans",
        flush=True,
    )
    outcomes = []
    with tempfile.TemporaryDirectory() as tmp:
        for option in chosen:
            folder = (args.keep or Path(tmp)) / f"option{OPTIONS.index(option) + 1}"
            outcomes.append(await run_option(folder, option, docs))
            print(table(outcomes, docs), flush=True)


if __name__ == "__main__":
    anyio.run(main)
