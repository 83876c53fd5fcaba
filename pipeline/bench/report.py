"""The sweep's numbers: one row per concurrency, the knee, plain-word diagnostics, CSV/JSON/PNG."""

from __future__ import annotations

import csv
import importlib.util
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from pipeline.bench.load import RequestResult
from pipeline.bench.observer import ServerObservation


@dataclass(frozen=True, slots=True)
class LevelSummary:
    concurrency: int
    requests: int
    errors: int
    wall_s: float
    aggregate_tok_s: float
    per_seq_tok_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    latency_max_s: float
    starved_by_reasoning: int
    max_running: float | None
    max_waiting: float | None
    kv_usage_max: float | None
    prefix_hit_rate: float | None
    client_cpu_share: float = 0.0  # CPU seconds of the bench process per wall second
    scaling: float = 1.0  # filled in once c=1 (or the smallest level) is known


def _percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def summarize(
    concurrency: int,
    results: list[RequestResult],
    wall_s: float,
    server: ServerObservation,
    *,
    client_cpu_s: float = 0.0,
) -> LevelSummary:
    """One row. Times are in the server's seconds: against the simulator, its speed is undone."""
    scale = server.time_scale
    cpu_share = client_cpu_s / wall_s if wall_s > 0 else 0.0
    ok = [r for r in results if r.error is None]
    decode_rates = [
        r.output_tokens / (r.latency_s - (r.ttft_s or 0.0)) for r in ok if r.latency_s > (r.ttft_s or 0)
    ]
    ttfts = [r.ttft_s * scale for r in ok if r.ttft_s is not None]
    wall_s *= scale
    return LevelSummary(
        concurrency=concurrency,
        requests=len(results),
        errors=len(results) - len(ok),
        wall_s=wall_s,
        aggregate_tok_s=sum(r.output_tokens for r in ok) / wall_s if wall_s > 0 else 0.0,
        per_seq_tok_s=statistics.median(decode_rates) / scale if decode_rates else 0.0,
        ttft_p50_s=_percentile(ttfts, 0.50),
        ttft_p99_s=_percentile(ttfts, 0.99),
        latency_max_s=max((r.latency_s for r in results), default=0.0) * scale,
        starved_by_reasoning=sum(1 for r in ok if r.starved),
        max_running=server.peak("vllm:num_requests_running"),
        max_waiting=server.peak("vllm:num_requests_waiting"),
        kv_usage_max=server.peak("vllm:kv_cache_usage_perc"),
        prefix_hit_rate=server.prefix_hit_rate,
        client_cpu_share=cpu_share,
    )


def with_scaling(levels: list[LevelSummary]) -> list[LevelSummary]:
    if not levels or levels[0].aggregate_tok_s <= 0:
        return levels
    base = levels[0].aggregate_tok_s
    return [LevelSummary(**{**asdict(level), "scaling": level.aggregate_tok_s / base}) for level in levels]


@dataclass(frozen=True, slots=True)
class SweepKnee:
    """Where a sweep peaked: the best level, and the first higher one whose throughput fell past it."""

    best: int
    regresses_at: int | None


def find_knee(levels: list[LevelSummary], drop: float = 0.05) -> SweepKnee | None:
    """The best aggregate, and the first higher concurrency where it falls by more than ``drop``."""
    if not levels:
        return None
    best = max(levels, key=lambda level: level.aggregate_tok_s)
    after = [level for level in levels if level.concurrency > best.concurrency]
    regress = next(
        (level.concurrency for level in after if level.aggregate_tok_s < best.aggregate_tok_s * (1 - drop)),
        None,
    )
    return SweepKnee(best.concurrency, regress)


def queued(level: LevelSummary) -> bool:
    """Whether the server ran fewer requests than the level sent and made the rest wait (its
    --max-num-seqs, or its KV cache, is below the level): more concurrency only queues."""
    return bool(level.max_waiting) and level.max_running is not None and level.max_running < level.concurrency


def diagnose(levels: list[LevelSummary], timeout_s: float, max_tokens: int) -> list[str]:
    """What the server's behaviour says, in plain words."""
    notes = []
    for level in levels:
        c = level.concurrency
        if queued(level):
            notes.append(
                f"c={c}: the server ran at most {level.max_running:.0f} requests and queued up to "
                f"{level.max_waiting:.0f}: the server's --max-num-seqs is below your concurrency"
            )
        if level.starved_by_reasoning:
            notes.append(
                f"c={c}: {level.starved_by_reasoning} requests ended with finish_reason=length before any "
                f"answer, still reasoning: reasoning is eating the token budget (max_tokens={max_tokens}); "
                "raise it or lower reasoning_effort"
            )
        if level.latency_max_s >= 0.8 * timeout_s:
            notes.append(
                f"c={c}: requests took up to {level.latency_max_s:.0f} s against a {timeout_s:.0f} s client "
                f"timeout: raise the timeout to >= {2 * level.latency_max_s:.0f} s"
            )
    busy = [level.concurrency for level in levels if level.client_cpu_share >= CLIENT_BUSY_SHARE]
    if busy:
        notes.append(
            f"c={','.join(map(str, busy))}: this benchmark client kept a CPU core busy: those rows measure "
            "the client, not the server (against the simulator, lower its --speed)"
        )
    notes.extend(_dips(levels))
    return notes


CLIENT_BUSY_SHARE = 0.8


def _dips(levels: list[LevelSummary]) -> list[str]:
    notes = []
    for before, level, after in zip(levels, levels[1:], levels[2:], strict=False):
        c = level.concurrency
        if c & (c - 1) == 0:
            continue  # powers of two are the usual CUDA-graph sizes
        span = after.concurrency - before.concurrency
        expected = before.aggregate_tok_s + (after.aggregate_tok_s - before.aggregate_tok_s) * (
            (c - before.concurrency) / span
        )
        if level.aggregate_tok_s < 0.9 * expected:
            notes.append(
                f"c={c}: throughput dips ({level.aggregate_tok_s:.0f} tok/s, neighbours suggest "
                f"{expected:.0f}) at a non-power-of-two concurrency: check the server's CUDA-graph "
                "capture sizes (--cuda-graph-sizes)"
            )
    return notes


COLUMNS = (
    *("c", "agg tok/s", "per-seq", "wall s", "scale", "TTFT p50", "TTFT p99"),
    *("err", "running", "waiting", "KV %", "prefix %"),
)


def format_table(rows: list[list[str]]) -> str:
    """Fixed-width text, first column left-aligned: reads the same in a terminal, a log or a file."""
    header = [*COLUMNS, ""]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        first, *rest = [cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in
                        enumerate(zip(cells, widths, strict=True))]  # fmt: skip
        return "  ".join([first, *rest[:-1], cells[-1]]).rstrip()

    return "\n".join([line(header), *(line(row) for row in rows)])


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def table_rows(levels: list[LevelSummary], knee: SweepKnee | None) -> list[list[str]]:
    rows = []
    for level in levels:
        mark = ""
        if knee and level.concurrency == knee.best:
            mark = "<- best"
        elif knee and level.concurrency == knee.regresses_at:
            mark = "<- regresses"
        rows.append(
            [
                str(level.concurrency),
                _fmt(level.aggregate_tok_s),
                _fmt(level.per_seq_tok_s),
                _fmt(level.wall_s),
                _fmt(level.scaling, ".2f") + "x",
                _fmt(level.ttft_p50_s, ".2f"),
                _fmt(level.ttft_p99_s, ".2f"),
                str(level.errors),
                _fmt(level.max_running, ".0f"),
                _fmt(level.max_waiting, ".0f"),
                _fmt(None if level.kv_usage_max is None else 100 * level.kv_usage_max),
                _fmt(None if level.prefix_hit_rate is None else 100 * level.prefix_hit_rate),
                mark,
            ]
        )
    return rows


def write_outputs(
    levels: list[LevelSummary], knee: SweepKnee | None, notes: list[str], folder: Path
) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    csv_path, json_path, png_path = folder / "bench.csv", folder / "bench.json", folder / "bench.png"
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(LevelSummary.__dataclass_fields__))
        writer.writeheader()
        writer.writerows(asdict(level) for level in levels)
    payload = {
        "levels": [asdict(level) for level in levels],
        "knee": asdict(knee) if knee else None,
        "diagnostics": notes,
    }
    json_path.write_bytes(orjson.dumps(payload, option=orjson.OPT_INDENT_2))
    if not plotting_available():
        return [csv_path, json_path]
    _plot(levels, knee, png_path)
    return [csv_path, json_path, png_path]


#: How to get the chart: matplotlib is an optional part (only the chart needs it).
PLOT_HINT = "no bench.png: the chart needs matplotlib (pip install -e '.[bench]')"


def plotting_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _plot(levels: list[LevelSummary], knee: SweepKnee | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, aggregate_axis = pyplot.subplots(figsize=(8, 4.5), dpi=120)
    xs = [level.concurrency for level in levels]
    aggregate_axis.plot(
        xs, [level.aggregate_tok_s for level in levels], "o-", color="tab:blue", label="aggregate"
    )
    aggregate_axis.set_xscale("log", base=2)
    aggregate_axis.set_xlabel("concurrency")
    aggregate_axis.set_ylabel("aggregate output tok/s", color="tab:blue")
    per_seq_axis = aggregate_axis.twinx()
    per_seq_axis.plot(
        xs, [level.per_seq_tok_s for level in levels], "s--", color="tab:orange", label="per sequence"
    )
    per_seq_axis.set_ylabel("per-sequence tok/s", color="tab:orange")
    if knee is not None:
        aggregate_axis.axvline(knee.best, color="tab:green", linestyle=":", label=f"best c={knee.best}")
    aggregate_axis.set_xticks(xs, [str(x) for x in xs])
    handles = aggregate_axis.get_legend_handles_labels()
    more = per_seq_axis.get_legend_handles_labels()
    aggregate_axis.legend(handles[0] + more[0], handles[1] + more[1], loc="upper left")
    aggregate_axis.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)
