"""`pipeline check`'s requests that fit in the KV cache against where the server starts preempting: the
LinkedIn job on the Adzuna ads of ../shared, with prefix caching on and off.

    .venv/bin/python benchmarks/kv_fit.py                  # the simulator (--kv-tokens 300000): ~30 min
    .venv/bin/python benchmarks/kv_fit.py --local          # the bundled real vLLM server: about an hour

Each server: the ads loaded with `pipeline load` into a fresh database, `pipeline check --json` for the
fit, then `pipeline run --limit 2C --concurrency C` (a run's start: C requests sent together, and the
wave that replaces them as they finish) at several levels, each reading vLLM's
``vllm:num_preemptions_total`` before and after.

* The simulator (``pipeline sim --profile gpt-oss-120b --speed 50 --kv-tokens 300000``, its
  ``--max-num-seqs`` raised so that the KV cache is what bounds it, started again for each level so that
  no level finds another's blocks cached): the lowest level where it preempts, found by bisection from
  half and twice the fit to 1% of it, and how far the fit is from it.
* The bundled real vLLM server (``--local``: SmolLM2-135M on the CPU, ``--kv-cache-gib 1``: 182 blocks of
  128 tokens): runs at half, one and two times the fit, one server per caching mode. CPU decoding is
  slow (tens of tokens a second over all requests), so this is no CI test.

Prints a Markdown table per mode; nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from support import PIPELINE, REPO, child_env, print_rows, simulator, stop

ADZUNA = REPO.parent / "shared" / "datasets" / "adzuna_uk_jobs_2499.csv"
JOB = str(REPO / "jobs" / "linkedin.yaml")
RENAMES = ("FullDescription=description", "LocationRaw=location")
# Its --max-num-seqs raised from the profile's 512: the KV cache, not the scheduler's cap, is measured.
SIM = ("--profile", "gpt-oss-120b", "--kv-tokens", "300000", "--max-num-seqs", "2048")
#: A level's run is this many times its concurrency: the wave sent together and the one that follows it.
WAVES = 2
LOCAL_KV_GIB = 1  # vLLM's CPU build takes whole GiB (VLLM_CPU_KVCACHE_SPACE)
LOCAL_TIMEOUT_S = "7200"  # a wave of CPU replies takes many minutes: none may time out


def pipeline(*args: str, exits: tuple[int, ...] = (0, 1)) -> str:
    """``pipeline ARGS``'s output; an exit code not in ``exits`` stops the benchmark."""
    done = subprocess.run([*PIPELINE, *args], capture_output=True, text=True, env=child_env(), cwd=REPO)
    if done.returncode not in exits:
        sys.exit(f"pipeline {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def preemptions(url: str) -> float:
    text = urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=30).read().decode()
    found = re.findall(r"^vllm:num_preemptions_total(?:\{[^}]*\})? (\S+)", text, re.M)
    return sum(float(value) for value in found)


def loaded(folder: Path, name: str) -> Path:
    database = folder / f"{name}.duckdb"
    renames = [word for rename in RENAMES for word in ("--rename", rename)]
    pipeline("load", str(ADZUNA), "--job", JOB, "--database", str(database), *renames)
    return database


def check_fit(database: Path, url: str, model: list[str], probes: int) -> tuple[int, str]:
    """The fit `pipeline check` says, and its kv_cache line."""
    words = ["--probes", str(probes), "--probe-timeout", "1200", "--json"]
    # Exit 3 is a fail line (a CPU server's replies at the job's c=256 outlast its timeout): the fit stands.
    said = pipeline(
        "check", JOB, "--database", str(database), "--endpoint", url, *model, *words, exits=(0, 1, 3)
    )
    report = json.loads(said)
    line = next(check["message"] for check in report["checks"] if check["name"] == "kv_cache")
    if report["requests_that_fit"] is None:
        sys.exit(f"check measured no fit: {line}")
    return int(report["requests_that_fit"]), line


def waves(database: Path, url: str, concurrency: int, model: list[str], timeout: list[str]) -> float:
    """A run's start at ``concurrency``: :data:`WAVES` x that many records, the first all sent together;
    the preemptions the server counted meanwhile."""
    before = preemptions(url)
    limit = str(WAVES * concurrency)
    pipeline("run", JOB, "--database", str(database), "--endpoint", url, *model, *timeout,
             "--concurrency", str(concurrency), "--limit", limit, "--progress", "log")  # fmt: skip
    return preemptions(url) - before


def simulated(folder: Path, caching: bool, speed: float) -> None:
    """The simulator: the fit, then the lowest level that preempts, by bisection (a fresh server and
    database each level, so that no level finds another's blocks cached)."""
    flags = [*SIM, "--speed", f"{speed:g}", *([] if caching else ["--no-prefix-caching"])]
    with simulator(*flags) as url:
        fit, line = check_fit(loaded(folder, "check"), url, [], probes=3)
    counts: dict[int, float] = {}

    def preempts(level: int) -> bool:
        if level not in counts:
            with simulator(*flags) as url:
                counts[level] = waves(loaded(folder, f"c{level}"), url, level, [], [])
            print(f"c={level}: {counts[level]:.0f} preemptions", file=sys.stderr, flush=True)
        return counts[level] > 0

    low, high = max(1, fit // 2), fit * 2
    while not preempts(high) and high < fit * 8:
        low, high = high, high * 2
    while high - low > max(1, fit // 100):  # to 1% of the fit
        middle = (low + high) // 2
        low, high = (low, middle) if preempts(middle) else (middle, high)
    rows = [(level, f"{level / fit:.2f}", f"{counts[level]:.0f}") for level in sorted(counts)]
    print(
        f"\n### simulator (--speed {speed:g}), prefix caching {'on' if caching else 'off'}\n\ncheck: {line}\n"
    )
    print_rows(
        (
            "concurrency",
            "x fit",
            "preemptions",
        ),
        rows,
    )
    if counts[high]:
        print(f"\nfirst preemption at c={high}: the fit ({fit}) is {(high - fit) / high:+.0%} from it")


#: A child process that serves the bundled vLLM server until it is stopped: argv[1] the KV cache in GiB,
#: argv[2] --max-num-seqs, argv[3] "off" to turn prefix caching off (vLLM's own flag).
SERVE = """
import dataclasses, sys
import anyio
from pipeline.local import LocalServerOptions, vllm_launch
from pipeline.local.server import LocalServer

async def main() -> None:
    options = LocalServerOptions(kv_cache_gib=float(sys.argv[1]), max_num_seqs=int(sys.argv[2]))
    launch = await vllm_launch(options)
    if sys.argv[3] == "off":
        launch = dataclasses.replace(launch, argv=[*launch.argv, "--no-enable-prefix-caching"])
    async with LocalServer(launch) as server:
        print(server.base_url, flush=True)
        await anyio.sleep_forever()

anyio.run(main)
"""


@contextmanager
def local_server(caching: bool, max_num_seqs: int) -> Iterator[str]:
    """The bundled vLLM server with a small KV cache, prefix caching on or off; its base URL."""
    argv = [sys.executable, "-c", SERVE, str(LOCAL_KV_GIB), str(max_num_seqs), "on" if caching else "off"]
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, text=True, env=child_env(), cwd=REPO, start_new_session=True
    )
    assert process.stdout is not None
    # Its log lines come first on the same stream: the URL is the line that is one.
    url = next((line.strip() for line in process.stdout if line.startswith("http://")), "")
    try:
        if not url.startswith("http://"):
            raise RuntimeError("the local server did not start (its log is in ~/.cache/pipeline/logs)")
        yield url
    finally:
        stop(process)


def real(folder: Path, caching: bool) -> None:
    """The real server: check's fit, then waves at half, one and two times it."""
    model = ["--model", "smollm2-135m"]
    timeout = ["--timeout", LOCAL_TIMEOUT_S]
    database = loaded(folder, f"local-{caching}")
    with local_server(caching, max_num_seqs=256) as url:
        fit, line = check_fit(database, url, model, probes=4)
        rows = []
        for level in sorted({max(1, fit // 2), fit, 2 * fit}):
            started = time.monotonic()
            count = waves(database, url, level, model, timeout)
            rows.append((level, f"{level / fit:.1f}", f"{count:.0f}", f"{time.monotonic() - started:.0f}"))
            print(rows[-1], file=sys.stderr, flush=True)
    print(f"\n### bundled vLLM (CPU), prefix caching {'on' if caching else 'off'}\n\ncheck: {line}\n")
    print_rows(("concurrency", "x fit", "preemptions", "seconds"), rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--local", action="store_true", help="the bundled real vLLM server, not the simulator"
    )
    parser.add_argument("--caching", choices=("on", "off", "both"), default="both")
    parser.add_argument("--speed", type=float, default=5.0, help="the simulator's time compression")
    args = parser.parse_args()
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.caching]
    with tempfile.TemporaryDirectory() as tmp:
        for caching in modes:
            if args.local:
                real(Path(tmp), caching)
            else:
                simulated(Path(tmp), caching, args.speed)


if __name__ == "__main__":
    main()
