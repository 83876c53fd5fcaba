"""`pipeline run` against three other ways to run the same batch job, on one simulated server.

    .venv/bin/python benchmarks/compare_clients.py --records 10000 --concurrency 256 --speed 60

Builds one folder (DuckDB source of N real Adzuna ads repeated under new ids, the job file, and the
request bodies `pipeline` itself builds for jobs/linkedin.yaml's prompt and schemas.linkedin:JobPosting),
starts ONE `pipeline sim --profile gpt-oss-120b --speed S`, then runs each client in turn, each as its
own child process, with a short idle gap between them (the simulator holds no state between clients
except its prefix cache, which one shared system prompt warms at the first request):

  a  `pipeline run job.yaml --progress log`; outcomes read from its DuckDB results/failures tables
  b  asyncio.gather + Semaphore over openai.AsyncOpenAI (SDK default max_retries=2), Pydantic
     validation, JSONL out (benchmarks/clients/naive_gather.py)
  c  a cookbook-style parallel processor: requests JSONL, retry queue (5 attempts), capacity
     tracking, aiohttp POSTs, JSONL out (benchmarks/clients/parallel_processor.py)
  d  Bespoke Curator (bespokelabs-curator), in its own virtualenv created on first use
     (benchmarks/clients/curator_client.py); skipped, with the reason, if it cannot be installed

Every client sends the same messages, JSON schema, max_tokens, temperature and reasoning_effort "low"
(Curator names the schema "output_schema" and drops "strict": it offers no way to set them). The
table gives, per client:

  done / failed / lost / dup  records with a result / with only a classified failure / with neither /
                              with more than one output row
  wall s, start s             spawn to exit; spawn to the server's first request (start-up cost)
  out tok/s, % cap            output tokens the server generated (vllm:generation_tokens_total delta)
                              per wall second, and their share of the profile's measured capacity at
                              this concurrency times --speed (measured with 1,500-token prompts and 400
                              output tokens; these requests share a cached ~1,700-token system prompt,
                              so a client keeping every slot busy can pass 100%)
  peak run, mean run          requests the server was running, sampled every 0.5 s from the first
                              request to the client's exit (the ramp-down included)
  HTTP reqs, CPU s/1k req     requests the server received; the client's user + system CPU seconds
                              (its reaped children included, from wait4) per 1,000 of them
  peak RSS MB                 VmHWM of the client process, or its process tree's peak summed RSS
  sim CPU %                   the simulator's own CPU use during the run: it must not be the limit

Nothing here is a test. ``--keep`` keeps the folder (logs, outputs, Curator's cache) for a look.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from pipeline.sim.profiles import PROFILES

sys.path.insert(0, str(Path(__file__).resolve().parent))
from clients.curator_setup import curator_python, tiktoken_cache
from clients.proc import descendants, process_cpu_s, server_metrics, status_kb
from support import start_simulator, stop

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
PYTHON = sys.executable
CURATOR_VENV = Path.home() / ".cache" / "pipeline-benchmarks" / "venv-curator"
CLIENT_NAMES = {
    "a": "pipeline run",
    "b": "gather+AsyncOpenAI",
    "c": "cookbook-style aiohttp",
    "d": "Bespoke Curator",
}
IDLE_GAP_S = 6.0  # longer than the simulator's keep-alive, so no connection outlives its client
CLIENT_TIMEOUT_S = 3600.0


@dataclass
class ClientResult:
    key: str
    name: str
    skipped: str | None = None
    exit_code: int | None = None
    wall_s: float = 0.0
    first_request_s: float | None = None  # spawn to the server's first request: start-up cost
    cpu_s: float = 0.0
    peak_rss_mb: float = 0.0
    server_requests: int = 0
    output_tokens: int = 0
    peak_running: int = 0
    mean_running: float = 0.0  # requests running on the server, sampled every 0.5 s after the first
    sim_cpu_s: float = 0.0
    done: int = 0
    failed: int = 0
    lost: int = 0
    duplicated: int = 0
    unknown_ids: int = 0
    failure_examples: list[str] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def cpu_s_per_1000(self) -> float:
        return self.cpu_s / max(self.server_requests, 1) * 1000


def measure(
    result: ClientResult, argv: list[str], env: dict[str, str], log_file: Path, base_url: str, sim_pid: int
) -> None:
    """Run one client to the end; fill in its wall time, CPU, memory and the server's counters."""
    before = server_metrics(base_url)
    sim_cpu_before = process_cpu_s(sim_pid)
    started = time.perf_counter()
    with log_file.open("w") as log:
        child = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=BENCHMARKS, start_new_session=True
        )
    peak_kb, next_scrape = 0, 0.0
    running: list[float] = []
    while True:
        # wait4 reaps the child with its own rusage: user + system time of it and its reaped children.
        pid, wait_status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        tree_kb = sum(status_kb(p, "VmRSS:") for p in [child.pid, *descendants(child.pid)])
        peak_kb = max(peak_kb, tree_kb, status_kb(child.pid, "VmHWM:"))
        now = time.perf_counter() - started
        if now >= next_scrape:
            next_scrape = now + 0.5
            sample = server_metrics(base_url)
            result.peak_running = max(result.peak_running, int(sample.get("vllm:num_requests_running", 0)))
            if result.first_request_s is not None:
                running.append(sample.get("vllm:num_requests_running", 0.0))
            if result.first_request_s is None and sample.get("pipeline_sim:requests", 0) > before.get(
                "pipeline_sim:requests", 0
            ):
                result.first_request_s = now
        if now > CLIENT_TIMEOUT_S:
            os.killpg(child.pid, signal.SIGKILL)
        time.sleep(0.1)
    result.wall_s = time.perf_counter() - started
    result.mean_running = sum(running) / len(running) if running else 0.0
    child.returncode = result.exit_code = os.waitstatus_to_exitcode(wait_status)
    result.cpu_s = usage.ru_utime + usage.ru_stime
    # VmHWM is this process image's own peak; ru_maxrss would include the parent's RSS at fork.
    result.peak_rss_mb = peak_kb / 1024
    after = server_metrics(base_url)
    result.sim_cpu_s = process_cpu_s(sim_pid) - sim_cpu_before
    result.server_requests = int(after["pipeline_sim:requests"] - before["pipeline_sim:requests"])
    result.output_tokens = int(after["vllm:generation_tokens"] - before["vllm:generation_tokens"])


# --- outcomes ---------------------------------------------------------------------------------------


def count_outcomes(
    result: ClientResult, source_ids: set[Any], successes: Iterable[Any], failures: Iterable[tuple[Any, str]]
) -> None:
    rows: Counter[Any] = Counter()
    done: set[Any] = set()
    for record_id in successes:
        rows[record_id] += 1
        done.add(record_id)
    failed: set[Any] = set()
    for record_id, message in failures:
        rows[record_id] += 1
        failed.add(record_id)
        if len(result.failure_examples) < 3:
            result.failure_examples.append(f"{record_id}: {message[:200]}")
    failed -= done
    result.done = len(done & source_ids)
    result.failed = len(failed & source_ids)
    result.lost = len(source_ids - done - failed)
    result.duplicated = sum(1 for count in rows.values() if count > 1)
    result.unknown_ids = len(set(rows) - source_ids)


def jsonl_outcomes(path: Path) -> tuple[list[Any], list[tuple[Any, str]]]:
    successes: list[Any] = []
    failures: list[tuple[Any, str]] = []
    if not path.exists():
        return successes, failures
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if not line.strip():
                continue
            row = json.loads(line)
            if "extracted" in row:
                successes.append(row["id"])
            else:
                failures.append((row["id"], str(row.get("error") or row.get("errors"))))
    return successes, failures


def duckdb_outcomes(database: Path) -> tuple[list[Any], list[tuple[Any, str]]]:
    with duckdb.connect(str(database), read_only=True) as connection:
        successes = [row[0] for row in connection.execute("SELECT record_id FROM results").fetchall()]
        failures = [
            (row[0], f"{row[1]}: {row[2]}")
            for row in connection.execute("SELECT record_id, failure_class, message FROM failures").fetchall()
        ]
    return successes, failures


# --- Curator's virtualenv ---------------------------------------------------------------------------


# --- the run ----------------------------------------------------------------------------------------


def client_command(
    key: str, folder: Path, base_url: str, concurrency: int, curator: Path | None
) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "PYTHONPATH": f"{BENCHMARKS}{os.pathsep}{REPO}"}
    if key == "a":
        argv = [PYTHON, "-m", "pipeline", "run", str(folder / "job.yaml"), "--progress", "log"]
        return argv, env
    if key == "b":
        argv = [PYTHON, "-m", "clients.naive_gather", str(folder), "--base-url", base_url]
        return [*argv, "--concurrency", str(concurrency), "--out", str(folder / "b.jsonl")], env
    if key == "c":
        argv = [PYTHON, "-m", "clients.parallel_processor", str(folder / "requests.jsonl")]
        argv += ["--base-url", base_url, "--max-in-flight", str(concurrency)]
        return [*argv, "--out", str(folder / "c.jsonl")], env
    assert curator is not None
    cache = folder / "curator-cache"  # fresh per run: Curator returns a cached run instantly
    shutil.rmtree(cache, ignore_errors=True)
    env |= {
        "PYTHONPATH": str(BENCHMARKS),  # not the repository: its venv has its own pydantic
        "CURATOR_CACHE_DIR": str(cache),
        "DO_NOT_TRACK": "1",
        "TELEMETRY_ENABLED": "false",  # Curator's PostHog client; offline it only fails at exit
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "OPENAI_API_KEY": "EMPTY",
    }
    if (tiktoken := tiktoken_cache(curator.parents[1])) is not None:
        env["TIKTOKEN_CACHE_DIR"] = str(tiktoken)
    argv = [str(curator), "-m", "clients.curator_client", str(folder), "--base-url", base_url]
    return [*argv, "--concurrency", str(concurrency), "--out", str(folder / "d.jsonl")], env


def run_client(
    key: str, folder: Path, base_url: str, args: argparse.Namespace, sim_pid: int, source_ids: set[Any]
) -> ClientResult:
    result = ClientResult(key, CLIENT_NAMES[key])
    curator = None
    if key == "d":
        install_log = Path(tempfile.gettempdir()) / "compare-clients-curator-install.log"
        curator, reason = curator_python(args.curator_venv, install_log)
        if curator is None:
            result.skipped = reason
            return result
    argv, env = client_command(key, folder, base_url, args.concurrency, curator)
    print(f"[{key}] {CLIENT_NAMES[key]}: running", flush=True)
    measure(result, argv, env, folder / f"{key}.log", base_url, sim_pid)
    if key == "a":
        successes, failures = duckdb_outcomes(folder / "source.duckdb")
    else:
        successes, failures = jsonl_outcomes(folder / f"{key}.jsonl")
    count_outcomes(result, source_ids, successes, failures)
    if result.exit_code not in (0, 1) or (result.done == 0 and result.failed == 0):
        tail = (folder / f"{key}.log").read_text(errors="replace").strip().splitlines()[-5:]
        result.failure_examples.append(f"exit {result.exit_code}; log tail: {' | '.join(tail)}")
    print(
        f"[{key}] done={result.done} failed={result.failed} lost={result.lost} "
        f"wall={result.wall_s:.1f}s exit={result.exit_code}",
        flush=True,
    )
    return result


def table(results: list[ClientResult], capacity: float) -> str:
    header = (
        ("client", 28),
        ("done", 6),
        ("failed", 6),
        ("lost", 5),
        ("dup", 4),
        ("wall s", 7),
        ("start s", 7),
        ("out tok/s", 9),
        ("% cap", 5),
        ("peak run", 8),
        ("mean run", 8),
        ("HTTP reqs", 9),
        ("CPU s/1k req", 12),
        ("peak RSS MB", 11),
        ("sim CPU %", 9),
    )
    lines = [
        " ".join(f"{name:>{width}}" if i else f"{name:<{width}}" for i, (name, width) in enumerate(header))
    ]
    lines.append(" ".join("-" * width for _, width in header))
    for result in results:
        label = f"({result.key}) {result.name}"
        if result.skipped:
            lines.append(f"{label:<28} skipped: {result.skipped}")
            continue
        start = f"{result.first_request_s:.1f}" if result.first_request_s is not None else "-"
        values = (
            result.done,
            result.failed,
            result.lost,
            result.duplicated,
            f"{result.wall_s:.1f}",
            start,
            f"{result.tokens_per_s:.0f}",
            f"{100 * result.tokens_per_s / capacity:.0f}",
            result.peak_running,
            f"{result.mean_running:.0f}",
            result.server_requests,
            f"{result.cpu_s_per_1000:.2f}",
            f"{result.peak_rss_mb:.0f}",
            f"{100 * result.sim_cpu_s / result.wall_s:.0f}" if result.wall_s else "-",
        )
        cells = [f"{label:<28}"] + [
            f"{value!s:>{width}}" for value, (_, width) in zip(values, header[1:], strict=True)
        ]
        lines.append(" ".join(cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--speed", type=float, default=60.0, help="the simulator's time compression")
    parser.add_argument("--profile", default="gpt-oss-120b", choices=sorted(PROFILES))
    parser.add_argument("--model", default="openai/gpt-oss-120b", help="the model name the simulator serves")
    parser.add_argument("--clients", default="a,b,c,d", help="which clients, in order: any of a,b,c,d")
    parser.add_argument("--curator-venv", type=Path, default=CURATOR_VENV)
    parser.add_argument("--keep", action="store_true", help="keep the benchmark folder and print its path")
    parser.add_argument("--json", type=Path, help="also write the results here as JSON")
    args = parser.parse_args()
    keys = [key.strip() for key in args.clients.split(",") if key.strip()]
    if unknown := [key for key in keys if key not in CLIENT_NAMES]:
        parser.error(f"unknown clients {unknown}; choose from a,b,c,d")
    capacity = PROFILES[args.profile].measured_at(args.concurrency) * args.speed

    folder = Path(tempfile.mkdtemp(prefix="compare-clients-"))
    started = time.perf_counter()
    sim, base_url = start_simulator(
        "--profile", args.profile, "--speed", str(args.speed), "--model", args.model, "--seed", "0"
    )
    results: list[ClientResult] = []
    try:
        env = {**os.environ, "PYTHONPATH": f"{BENCHMARKS}{os.pathsep}{REPO}"}
        prepare = [PYTHON, "-m", "clients.prepare", str(folder), "--records", str(args.records)]
        prepare += ["--concurrency", str(args.concurrency), "--base-url", base_url, "--model", args.model]
        subprocess.run(prepare, check=True, cwd=BENCHMARKS, env=env)
        with duckdb.connect(str(folder / "source.duckdb"), read_only=True) as connection:
            source_ids = {row[0] for row in connection.execute("SELECT id FROM postings").fetchall()}
        for index, key in enumerate(keys):
            if index:
                time.sleep(IDLE_GAP_S)
            results.append(run_client(key, folder, base_url, args, sim.pid, source_ids))
    finally:
        stop(sim)
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)

    print()
    print(
        f"{args.records} records, concurrency {args.concurrency}, one `pipeline sim --profile {args.profile} "
        f"--speed {args.speed:g}`; capacity at c={args.concurrency}: "
        f"{PROFILES[args.profile].measured_at(args.concurrency):.0f} tok/s x {args.speed:g} "
        f"= {capacity:.0f} tok/s"
    )
    print(table(results, capacity))
    for result in results:
        for example in result.failure_examples:
            print(f"  ({result.key}) {example}")
    print(f"total {time.perf_counter() - started:.0f} s" + (f"; folder kept: {folder}" if args.keep else ""))
    if args.json:
        payload = {
            "records": args.records,
            "concurrency": args.concurrency,
            "speed": args.speed,
            "profile": args.profile,
            "capacity_tokens_per_s": capacity,
            "clients": [
                {
                    **asdict(result),
                    "tokens_per_s": result.tokens_per_s,
                    "cpu_s_per_1000": result.cpu_s_per_1000,
                }
                for result in results
            ],
        }
        args.json.write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
