"""The night matrix: the LinkedIn job's nights against healthy-but-noisy and broken simulated servers.
A healthy night is never stopped and never alarms; a broken one is always stopped, within the answer
breaker's bound, with its cause named, and a plain run once the server is fixed does every record.

    .venv/bin/python benchmarks/night_matrix.py              # every cell, about 15 min on 2 cores
    .venv/bin/python benchmarks/night_matrix.py --quick      # one cell of each kind, about 2 min
    .venv/bin/python benchmarks/night_matrix.py --only broken   # one group (noisy, causes, contexts, broken)

Each cell is a fresh database: the real Adzuna ads of ../shared loaded with `pipeline load`, then the
user's own commands (`pipeline run jobs/linkedin.yaml`, `pipeline report --fail-on-drift`) against a
`pipeline sim --profile gpt-oss-120b --speed 50` started for the cell. The job is jobs/linkedin.yaml as
it stands, but for its back-off between server errors, scaled by the simulator's speed (2 s -> 0.04 s),
so that a night of 5xx takes seconds as the rest does.

* noisy: 0, 5, 13 and 25% of records failing after their re-asks (invalid JSON, schema-invalid and
  truncated answers in equal shares, plus 3% of requests answered 500/503), at c=32 and c=256, runs of
  100, 200 and the rest of the backlog (2,299 ads). Each night follows a baseline night of 200 ads on
  the same server, and `report --fail-on-drift` after it must exit 0.
* causes: 13% and 25% failing from one cause alone (invalid JSON, schema-invalid, truncated, 5xx).
* contexts: 4,096 and 131,072 tokens, with and without `/tokenize` (a proxy in front of vLLM), 13%.
* broken: every answer invalid, schema-invalid, truncated, or every request a 5xx, on 400 ads: the run
  must stop (exit 3) naming the cause, within the answer breaker's ``attempts x (32 + c)`` requests (3
  attempts) or, for 5xx, the router's ``attempts x (50 + c)`` (50 records failing in a row, 7 attempts
  each), and a plain run against the fixed server must then do all 400.

A record fails after its re-asks with the chance a request's fault comes on each of its attempts: three
(one answer and two re-asks, or two truncation retries) for the answer faults, seven for a 5xx (six
transient retries), so a share ``s`` of records failing asks for ``s ** (1/3)`` of requests
(``s ** (1/7)`` for 5xx). Mixed, the share solves the same sum; :data:`MIXED` gives it.

Prints one Markdown table per group; the exit code is 1 when a cell does not hold.
"""

from __future__ import annotations

import argparse
import csv
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import yaml
from support import PIPELINE, REPO, child_env, print_rows, simulator

ADZUNA = REPO.parent / "shared" / "datasets" / "adzuna_uk_jobs_2499.csv"
RENAMES = ("FullDescription=description", "LocationRaw=location")
MODEL = "openai/gpt-oss-120b"
BASELINE = 200  # ads in the night before each noisy cell
BROKEN_RECORDS = 400
WINDOW = 32  # pipeline.run.answer_breaker.WINDOW, read here from the stop line's span
ATTEMPTS = 3  # one answer and two re-asks (jobs/linkedin.yaml's retry.reasks)
TRANSIENT_ATTEMPTS = 7  # one request and six transient retries (retry.transient_retries)
IN_A_ROW = (
    50  # records failing on the server side in a row that stop a run (abort_after_consecutive_failures)
)
#: The share of requests with one of the answer faults (split in three) that fails this share of records.
MIXED = {0.0: 0.0, 0.05: 0.449, 0.13: 0.585, 0.25: 0.698}
NOISE_5XX = 0.03
ANSWER_FAULTS = ("invalid-json", "schema-invalid", "length")
CAUSES = (*ANSWER_FAULTS, "server-error")


@dataclass(frozen=True)
class Cell:
    group: str
    faults: dict[str, float]  # --fault-NAME: share of requests
    concurrency: int
    records: int | None  # None: every record left
    context: int = 131_072
    tokenize: bool = True
    label: str = ""

    @property
    def broken(self) -> bool:
        return self.group == "broken"

    def simulator_args(self, seed: int) -> list[str]:
        args = ["--profile", "gpt-oss-120b", "--speed", "50", "--seed", str(seed)]
        args += ["--max-model-len", str(self.context), "--tokenize" if self.tokenize else "--no-tokenize"]
        for name, share in self.faults.items():
            args += [f"--fault-{name}", f"{share:.4f}"]
        return args


@dataclass
class Outcome:
    exit_code: int
    stop: str = ""
    requests: int = 0
    done: int = 0
    failed: int = 0
    retryable: int = 0
    classes: str = ""
    drift_exit: int | None = None
    after_fix: str = ""
    problems: list[str] = field(default_factory=list)


def noisy(share: float) -> dict[str, float]:
    """Answer faults in equal thirds failing ``share`` of records, and the 5xx noise."""
    faults = dict.fromkeys(ANSWER_FAULTS, MIXED[share] / 3)
    return {**faults, "server-error": NOISE_5XX} if share else faults


def one_cause(cause: str, share: float) -> dict[str, float]:
    tries = 7 if cause == "server-error" else ATTEMPTS
    return {cause: share ** (1 / tries)}


def cells(quick: bool) -> Iterator[Cell]:
    shares = (0.13,) if quick else (0.0, 0.05, 0.13, 0.25)
    sizes: tuple[int | None, ...] = (200,) if quick else (100, 200, None)
    for share in shares:
        for concurrency in (256,) if quick else (32, 256):
            for size in sizes:
                yield Cell("noisy", noisy(share), concurrency, size, label=f"{share:.0%} mixed")
    for cause in () if quick else CAUSES:
        for share in (0.13, 0.25):
            yield Cell("causes", one_cause(cause, share), 256, 200, label=f"{share:.0%} {cause}")
    for context in (4_096, 131_072):
        for tokenize in (True,) if quick else (True, False):
            for concurrency in (256,) if quick else (32, 256):
                label = f"13% mixed, {context:,}{'' if tokenize else ', no /tokenize'}"
                yield Cell("contexts", noisy(0.13), concurrency, 200, context, tokenize, label)
    for cause in ("invalid-json",) if quick else CAUSES:
        for concurrency in (32,) if quick else (32, 256):
            yield Cell("broken", {cause: 1.0}, concurrency, BROKEN_RECORDS, label=f"all {cause}")


def pipeline(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PIPELINE, *args], capture_output=True, text=True, env=child_env(), cwd=REPO, timeout=1800
    )


def write_job(folder: Path) -> Path:
    """jobs/linkedin.yaml with absolute paths, its back-off scaled by the simulator's speed."""
    job = yaml.safe_load((REPO / "jobs" / "linkedin.yaml").read_text())
    job["source"]["seed_file"] = str(REPO / "data" / "sample_postings.jsonl")
    job["prompt"]["examples_file"] = str(REPO / "jobs" / "examples" / "linkedin.jsonl")
    job["retry"].update(backoff_initial_s=2.0 / 50, backoff_max_s=120.0 / 50)
    path = folder / "linkedin.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def load(job: Path, source: Path, database: Path) -> None:
    renames = [item for rename in RENAMES for item in ("--rename", rename)]
    done = pipeline("load", str(source), "--job", str(job), "--database", str(database), *renames)
    if done.returncode != 0:
        sys.exit(f"pipeline load {source} exited {done.returncode}: {done.stderr.strip()[-500:]}")


def first_ads(folder: Path, count: int) -> Path:
    """The first ``count`` ads of the CSV, as a CSV of their own (read from ../shared, written here)."""
    path = folder / f"adzuna_{count}.csv"
    with ADZUNA.open(newline="") as source, path.open("w", newline="") as target:
        rows = csv.reader(source)
        writer = csv.writer(target)
        for number, row in enumerate(rows):
            if number > count:
                break
            writer.writerow(row)
    return path


def chat_requests(url: str) -> int:
    """The simulator's own count of the chat requests it was sent."""
    base = url.removesuffix("/v1")
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = re.search(r"^pipeline_sim:chat_requests_total\{[^}]*\} (\S+)$", text, re.MULTILINE)
    return int(float(found.group(1))) if found else -1


def run(job: Path, database: Path, url: str, *more: str) -> subprocess.CompletedProcess[str]:
    return pipeline(
        "run", str(job), "--database", str(database), "--endpoint", url, "--model", MODEL,
        "--progress", "log", "--log-level", "warning", *more,
    )  # fmt: skip


def counts(database: Path, run_id: int | None = None) -> tuple[int, int, int]:
    """Results, failures for good, and failures kept retryable (class transient) of a run (or all)."""
    where = "" if run_id is None else f" WHERE run_id = {run_id}"
    with duckdb.connect(str(database), read_only=True) as connection:
        done = connection.execute(f"SELECT count(*) FROM results{where}").fetchone()
        failures = connection.execute(
            f"SELECT count(*) FILTER (failure_class <> 'transient'), "
            f"count(*) FILTER (failure_class = 'transient') FROM failures{where}"
        ).fetchone()
    assert done is not None
    assert failures is not None
    return done[0], failures[0], failures[1]


def classes(database: Path, run_id: int | None = None) -> str:
    """The failures of a run (or all) by class, most first: what the failed share is made of."""
    where = "" if run_id is None else f" WHERE run_id = {run_id}"
    sql = f"SELECT failure_class, count(*) AS n FROM failures{where} GROUP BY 1 ORDER BY n DESC, 1"
    with duckdb.connect(str(database), read_only=True) as connection:
        return ", ".join(f"{name} {count}" for name, count in connection.execute(sql).fetchall())


def last_run_id(database: Path) -> int:
    with duckdb.connect(str(database), read_only=True) as connection:
        row = connection.execute("SELECT max(run_id) FROM runs").fetchone()
    assert row is not None
    return int(row[0])


def stop_line(completed: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in completed.stderr.splitlines() if line.startswith("error:")]
    return lines[-1].removeprefix("error: ") if lines else ""


def noisy_night(cell: Cell, job: Path, database: Path, url: str) -> Outcome:
    baseline = run(job, database, url, "--limit", str(BASELINE), "--concurrency", str(cell.concurrency))
    before = chat_requests(url)
    limit = [] if cell.records is None else ["--limit", str(cell.records)]
    night = run(job, database, url, *limit, "--concurrency", str(cell.concurrency))
    outcome = Outcome(night.returncode, stop_line(night), chat_requests(url) - before)
    night_id = last_run_id(database)
    outcome.done, outcome.failed, outcome.retryable = counts(database, night_id)
    outcome.classes = classes(database, night_id)
    drift = pipeline("report", str(job), "--database", str(database), "--fail-on-drift")
    outcome.drift_exit = drift.returncode
    if baseline.returncode not in (0, 1):
        outcome.problems.append(f"the baseline night exited {baseline.returncode}: {stop_line(baseline)}")
    if night.returncode not in (0, 1):
        outcome.problems.append(f"stopped (exit {night.returncode}): {outcome.stop}")
    if drift.returncode != 0:
        outcome.problems.append(f"report --fail-on-drift exited {drift.returncode}: {drift.stdout[-300:]}")
    return outcome


def broken_night(cell: Cell, job: Path, database: Path, url: str, fixed_url: str) -> Outcome:
    night = run(job, database, url, "--concurrency", str(cell.concurrency))
    outcome = Outcome(night.returncode, stop_line(night), chat_requests(url))
    outcome.done, outcome.failed, outcome.retryable = counts(database)
    outcome.classes = classes(database)
    cause = next(iter(cell.faults)).replace("-", "_").replace("length", "truncated")
    bound = (
        TRANSIENT_ATTEMPTS * (IN_A_ROW + cell.concurrency)
        if cause == "server_error"
        else ATTEMPTS * (WINDOW + cell.concurrency)
    )
    if night.returncode != 3:
        outcome.problems.append(f"not stopped: exit {night.returncode}")
    elif cause != "server_error" and cause not in outcome.stop:
        outcome.problems.append(f"the stop line does not name {cause}")
    if outcome.requests > bound:
        outcome.problems.append(f"{outcome.requests} requests, past the bound {bound}")
    fixed = run(job, database, fixed_url, "--concurrency", str(cell.concurrency))
    done, failed, retryable = counts(database)
    outcome.after_fix = f"exit {fixed.returncode}: {done} done, {failed + retryable} not"
    if (fixed.returncode, done) != (0, BROKEN_RECORDS):
        outcome.problems.append(f"after the fix: {outcome.after_fix} {stop_line(fixed)}")
    return outcome


def play(cell: Cell, number: int, job: Path, sources: dict[str, Path], folder: Path) -> Outcome:
    database = folder / f"cell{number}.duckdb"
    shutil.copyfile(sources["broken" if cell.broken else "all"], database)
    with simulator(*cell.simulator_args(seed=number)) as url:
        if not cell.broken:
            return noisy_night(cell, job, database, url)
        with simulator("--profile", "gpt-oss-120b", "--speed", "50", "--seed", str(number)) as fixed:
            return broken_night(cell, job, database, url, fixed)


def row(cell: Cell, outcome: Outcome) -> tuple[object, ...]:
    selected = outcome.done + outcome.failed + outcome.retryable
    share = f"{outcome.failed / selected:.1%}" if selected else "-"
    stopped = f"exit {outcome.exit_code}" + (f": {outcome.stop[:90]}" if outcome.stop else "")
    last = outcome.after_fix if cell.broken else f"exit {outcome.drift_exit}"
    verdict = "holds" if not outcome.problems else "FAILS: " + "; ".join(outcome.problems)
    size = "rest" if cell.records is None else cell.records
    return (cell.label, cell.concurrency, size, stopped, outcome.requests, outcome.done,
            outcome.failed, share, outcome.classes, outcome.retryable, last, verdict)  # fmt: skip


HEADERS = {
    "broken": "after the fix (plain run)",
    "noisy": "report --fail-on-drift",
    "causes": "report --fail-on-drift",
    "contexts": "report --fail-on-drift",
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one cell of each kind")
    parser.add_argument("--only", choices=sorted(HEADERS), help="one group")
    args = parser.parse_args()
    failed = 0
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        job = write_job(folder)
        sources = {"all": folder / "all.duckdb", "broken": folder / "broken.duckdb"}
        load(job, ADZUNA, sources["all"])
        load(job, first_ads(folder, BROKEN_RECORDS), sources["broken"])
        groups: dict[str, list[tuple[object, ...]]] = {}
        for number, cell in enumerate(cells(args.quick), start=1):
            if args.only not in (None, cell.group):
                continue
            outcome = play(cell, number, job, sources, folder)
            failed += bool(outcome.problems)
            groups.setdefault(cell.group, []).append(row(cell, outcome))
            shown = " | ".join(str(value) for value in groups[cell.group][-1])
            print(f"cell {number} ({cell.group}): | {shown} |", file=sys.stderr, flush=True)
    for group, rows in groups.items():
        print(f"\n### {group}\n")
        header = ("server", "c", "records", "run", "requests", "done", "failed", "failed share",
                  "failures by class", "left retryable", HEADERS[group], "verdict")  # fmt: skip
        print_rows(header, rows)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
