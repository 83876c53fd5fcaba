"""The sweep's numbers: one row per concurrency, the knee, plain-word diagnostics, CSV/JSON/PNG.

Against a simulator at ``--speed S`` every time and rate is the model's (the speed undone), named so:
the table's ``model s`` beside ``wall s`` (this machine's clock), and a line that says which is which."""

from __future__ import annotations

import csv
import importlib.util
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from pipeline.bench.load import RequestResult
from pipeline.bench.observer import ServerObservation
from pipeline.wording import counted, duration


@dataclass(frozen=True, slots=True)
class LevelSummary:
    concurrency: int
    requests: int
    errors: int
    model_s: float  # the level's time in the server's seconds: the model's (a simulator's speed undone)
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
    wall_s: float = 0.0  # the level's time on this machine's clock
    speed: float = 1.0  # a simulator's --speed (its seconds per wall second); 1: a real server
    server_cpu_share: float | None = None  # a simulator on this machine: its CPU seconds per wall second
    machine_cpu_share: float | None = None  # ... and the share of this machine's CPUs busy meanwhile


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
    server_cpu: tuple[float | None, float | None] = (None, None),
) -> LevelSummary:
    """One row. Times are in the server's seconds: against the simulator, its speed is undone.
    ``server_cpu``: a simulator on this machine's CPU share and the machine's (:mod:`.server_cpu`)."""
    scale = server.time_scale
    cpu_share = client_cpu_s / wall_s if wall_s > 0 else 0.0
    model_s = wall_s * scale
    ok = [r for r in results if r.error is None]
    decode_rates = [
        r.output_tokens / (r.latency_s - (r.ttft_s or 0.0)) for r in ok if r.latency_s > (r.ttft_s or 0)
    ]
    ttfts = [r.ttft_s * scale for r in ok if r.ttft_s is not None]
    return LevelSummary(
        concurrency=concurrency,
        requests=len(results),
        errors=len(results) - len(ok),
        model_s=model_s,
        aggregate_tok_s=sum(r.output_tokens for r in ok) / model_s if model_s > 0 else 0.0,
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
        wall_s=wall_s,
        speed=scale,
        server_cpu_share=server_cpu[0],
        machine_cpu_share=server_cpu[1],
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
    notes = [note for level in levels for note in _level_notes(level, timeout_s, max_tokens)]
    dips = _dips(levels)
    return notes + _cpu_notes(levels) + list(dips.values()) + _non_monotonic(levels, explained=set(dips))


def _level_notes(level: LevelSummary, timeout_s: float, max_tokens: int) -> list[str]:
    c, notes = level.concurrency, []
    if queued(level):
        notes.append(
            f"c={c}: the server ran at most {level.max_running:.0f} requests and queued up to "
            f"{level.max_waiting:.0f}: the server's --max-num-seqs is below your concurrency"
        )
    if level.starved_by_reasoning:
        notes.append(
            f"c={c}: {counted(level.starved_by_reasoning, 'request')} ended with finish_reason=length before "
            f"any answer, still reasoning: reasoning is eating the token budget (max_tokens={max_tokens}); "
            "raise it or lower reasoning_effort"
        )
    if level.latency_max_s >= 0.8 * timeout_s:
        notes.append(
            f"c={c}: requests took up to {level.latency_max_s:.0f} s against a {timeout_s:.0f} s client "
            f"timeout: raise the timeout to >= {2 * level.latency_max_s:.0f} s"
        )
    return notes


#: A process's CPU seconds per wall second from which it kept a core busy (the client, a simulator).
CLIENT_BUSY_SHARE = 0.8
#: The share of this machine's CPUs busy from which a simulator on it cannot keep the model's time.
MACHINE_BUSY_SHARE = 0.9


def _cpu_notes(levels: list[LevelSummary]) -> list[str]:
    """The rows that measure a CPU rather than the server: this client's, a simulator's on this
    machine, or the machine's, busy with other work besides."""

    def at(busy: list[LevelSummary]) -> str:
        return "c=" + ",".join(str(level.concurrency) for level in busy)

    notes = []
    if busy := [level for level in levels if level.client_cpu_share >= CLIENT_BUSY_SHARE]:
        notes.append(
            f"{at(busy)}: this benchmark client kept a CPU core busy: those rows measure the client, not "
            "the server (against the simulator, lower its --speed)"
        )
    if busy := [level for level in levels if (level.server_cpu_share or 0) >= CLIENT_BUSY_SHARE]:
        notes.append(
            f"{at(busy)}: the simulator kept a CPU core of this machine busy: those rows measure its CPU, "
            "not the model it simulates (lower its --speed)"
        )
    if busy := [level for level in levels if (level.machine_cpu_share or 0) >= MACHINE_BUSY_SHARE]:
        most = max(level.machine_cpu_share or 0 for level in busy)
        notes.append(
            f"{at(busy)}: this machine's CPUs were up to {most:.0%} busy with the simulator on them: its "
            "replies came late by the machine's load, not the model's; sweep again on a quiet machine"
        )
    return notes


def _dips(levels: list[LevelSummary]) -> dict[int, str]:
    """Each level whose throughput dips below its neighbours' at a non-power-of-two concurrency."""
    notes = {}
    for before, level, after in zip(levels, levels[1:], levels[2:], strict=False):
        c = level.concurrency
        if c & (c - 1) == 0:
            continue  # powers of two are the usual CUDA-graph sizes
        span = after.concurrency - before.concurrency
        expected = before.aggregate_tok_s + (after.aggregate_tok_s - before.aggregate_tok_s) * (
            (c - before.concurrency) / span
        )
        if level.aggregate_tok_s < 0.9 * expected:
            notes[c] = (
                f"c={c}: throughput dips ({level.aggregate_tok_s:.0f} tok/s, neighbours suggest "
                f"{expected:.0f}) at a non-power-of-two concurrency: check the server's CUDA-graph "
                "capture sizes (--cuda-graph-sizes)"
            )
    return notes


#: A level's throughput this far below a lower level's, before the best, bends the curve back.
NON_MONOTONIC_DROP = 0.05


def _non_monotonic(levels: list[LevelSummary], explained: set[int]) -> list[str]:
    """Below its best, a server's throughput grows with concurrency: a level that falls under a lower
    one's (by more than :data:`NON_MONOTONIC_DROP`) and a best found above it say the curve is noise
    (a busy machine, a server shared with other work) as much as the server. The ``explained`` levels
    (a CUDA-graph size's dip) have their own note."""
    knee = find_knee(levels)
    if knee is None:
        return []
    falls, top = [], None
    for level in sorted(levels, key=lambda level: level.concurrency):
        if level.concurrency >= knee.best:
            break
        fell = top is not None and level.aggregate_tok_s < top.aggregate_tok_s * (1 - NON_MONOTONIC_DROP)
        if fell and top is not None and level.concurrency not in explained:
            falls.append(f"c={level.concurrency} below c={top.concurrency} "
                         f"({level.aggregate_tok_s:,.0f} vs {top.aggregate_tok_s:,.0f} tok/s)")  # fmt: skip
        if top is None or level.aggregate_tok_s > top.aggregate_tok_s:
            top = level
    if not falls:
        return []
    return [
        f"the curve is not monotonic: {'; '.join(falls)}, then its best at c={knee.best}: the knee is "
        "uncertain; sweep again (more --rounds, a quiet machine, a server no one else uses)"
    ]


def sweep_lines(levels: list[LevelSummary], simulator_pid: int | None) -> list[str]:
    """What the table's times are and what was checked: against a simulator, the model's time (its
    --speed undone) beside this machine's, and whether its CPU was watched; how long the sweep took."""
    if not levels:
        return []
    speed, wall_s = levels[-1].speed, sum(level.wall_s for level in levels)
    took = f"swept {counted(len(levels), 'level')} in {duration(wall_s)} wall time"
    if speed == 1:
        lines = [took]
    else:
        model_s = sum(level.model_s for level in levels)
        lines = [
            f"{took} ({duration(model_s)} of model time at --speed {speed:g})",
            f"the server is a simulator at --speed {speed:g}: times and rates are the model's (model s), "
            "wall s is this machine's clock",
        ]
    if simulator_pid is not None:
        lines.append(
            f"the simulator runs on this machine (pid {simulator_pid}): its CPU and the machine's were "
            "checked at each level, as this client's (sim CPU: % of one core; host CPU: % of all)"
        )
    elif speed != 1:
        lines.append("the simulator was not found listening on this machine (/proc): its CPU is not checked")
    return lines


def table_columns(levels: list[LevelSummary]) -> list[str]:
    """The table's columns: ``model s`` beside ``wall s`` against a simulator, its CPU and the
    machine's when they were read."""
    simulated = any(level.speed != 1 for level in levels)
    watched = any(level.server_cpu_share is not None for level in levels)
    return [
        *("c", "agg tok/s", "per-seq", *(["model s"] if simulated else []), "wall s", "scale"),
        *("TTFT p50", "TTFT p99", "err", "running", "waiting", "KV %", "prefix %"),
        *(["sim CPU %", "host CPU %"] if watched else []),
    ]


def format_table(rows: list[list[str]], columns: list[str]) -> str:
    """Fixed-width text, first column left-aligned: reads the same in a terminal, a log or a file."""
    header = [*columns, ""]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        first, *rest = [cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in
                        enumerate(zip(cells, widths, strict=True))]  # fmt: skip
        return "  ".join([first, *rest[:-1], cells[-1]]).rstrip()

    return "\n".join([line(header), *(line(row) for row in rows)])


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def _percent(share: float | None) -> str:
    return _fmt(None if share is None else 100 * share)


def table_rows(levels: list[LevelSummary], knee: SweepKnee | None) -> list[list[str]]:
    """One row a level, in :func:`table_columns`' order."""
    simulated = any(level.speed != 1 for level in levels)
    watched = any(level.server_cpu_share is not None for level in levels)
    rows = []
    for level in levels:
        mark = ""
        if knee and level.concurrency == knee.best:
            mark = "<- best"
        elif knee and level.concurrency == knee.regresses_at:
            mark = "<- regresses"
        times = [_fmt(level.model_s)] if simulated else []
        cpu = [_percent(level.server_cpu_share), _percent(level.machine_cpu_share)] if watched else []
        rows.append(
            [
                *(f"{level.concurrency:,}", f"{level.aggregate_tok_s:,.1f}", _fmt(level.per_seq_tok_s)),
                *(*times, _fmt(level.wall_s), _fmt(level.scaling, ".2f") + "x"),
                *(_fmt(level.ttft_p50_s, ".2f"), _fmt(level.ttft_p99_s, ".2f"), f"{level.errors:,}"),
                *(_fmt(level.max_running, ".0f"), _fmt(level.max_waiting, ".0f")),
                *(_percent(level.kv_usage_max), _percent(level.prefix_hit_rate), *cpu, mark),
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
