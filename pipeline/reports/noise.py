"""The noise floor of ``pipeline compare``: how much variant A differs from a re-run of itself.

vLLM at temperature 0 is not deterministic: the batch a request lands in changes its logits, so A
against a re-run of A (``pipeline run JOB --variant A --rerun``, stored as ``A~rerun``) does not agree
100%. A field where B disagrees with A is worth a look only when it disagrees by more than that, beyond
the interval of the gap (:func:`pipeline.quality.intervals.noise_floor`). Both agreements are measured
on the records A, B and the re-run all extracted, and resampled together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.job.commands import Asked
from pipeline.job.spec import JobSpec
from pipeline.job.variants import rerun_name
from pipeline.quality.bootstrap import Bootstrap
from pipeline.quality.intervals import NoiseFloor, noise_floor
from pipeline.quality.scores import TOO_SMALL, has_spread, interval_json
from pipeline.reports.reading import Sample, StoredResult
from pipeline.reports.review import variant_agreement
from pipeline.wording import counted


@dataclass(frozen=True, slots=True)
class NoiseReport:
    reference: str  # A
    rerun: str  # A~rerun
    records: int  # the records A, B and the re-run all extracted
    floors: Mapping[str, NoiseFloor]  # per scored path

    def field_json(self, path: str) -> dict[str, Any]:
        floor = self.floors.get(path)
        if floor is None:
            return {}
        return {
            "noise_agreement": floor.noise_agreement,
            **(
                interval_json("noise_agreement_ci", floor.noise_agreement_ci)
                if floor.noise_agreement_ci
                else {"noise_agreement_ci": None}
            ),
            "noise_gap": floor.gap.to_json(),
            "beyond_noise": floor.beyond_noise,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "rerun": self.rerun,
            "records": self.records,
            "beyond_noise": [path for path, floor in self.floors.items() if floor.beyond_noise],
        }


def measure_noise(
    spec: JobSpec,
    results: Mapping[str, Mapping[str, StoredResult]],
    names: tuple[str, str],
    rerun: Mapping[str, StoredResult],
    settings: tuple[float | None, Bootstrap],
) -> NoiseReport:
    """A-vs-B beside A-vs-rerun on the records all three extracted (``rerun`` holds only those)."""
    fuzzy_threshold, bootstrap = settings
    a, b = (results[name] for name in names)
    common = [key for key in rerun if key in a and key in b]
    on_common = {key: a[key] for key in common}
    versus = variant_agreement(spec, on_common, {key: b[key] for key in common}, fuzzy_threshold)
    itself = variant_agreement(spec, on_common, {key: rerun[key] for key in common}, fuzzy_threshold)
    return NoiseReport(names[0], rerun_name(names[0]), len(common), noise_floor(versus, itself, bootstrap))


def noise_lines(noise: NoiseReport | None, hint: str) -> list[str]:
    """The noise table, or (without a re-run) what the noise floor is and the commands that measure it."""
    if noise is None:
        return [hint]
    if not noise.records:
        return [f"noise floor: {noise.rerun} shares no extracted record with both variants", hint]
    rows = [("field", "A vs B", f"A vs {noise.rerun}", "gap (rerun - B)", "beyond noise")]
    for path, floor in noise.floors.items():
        rows.append(
            (
                path,
                _number(floor.agreement),
                _number(floor.noise_agreement) + _interval(floor.noise_agreement_ci),
                "-" if floor.gap.value is None else f"{floor.gap.value:+.3f}{floor.gap.interval_text()}",
                "yes" if floor.beyond_noise else "no",
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    beyond = [path for path, floor in noise.floors.items() if floor.beyond_noise]
    level = next(iter(noise.floors.values())).gap.level if noise.floors else 0.95
    return [
        f"noise floor: {noise.reference} against its re-run {noise.rerun}, over the "
        f"{counted(noise.records, 'record')} A, B and the re-run all extracted (agreement: F1 for lists, "
        "accuracy otherwise)",
        *(
            "  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in rows
        ),
        f"gap intervals: simultaneous over the {counted(len(noise.floors), 'field')} ({level:.1%} each), "
        "± z standard "
        "errors of the paired bootstrap or of swapping B's and the re-run's answers at random, the larger",
        "beyond the noise (the gap's interval is above 0): " + (", ".join(beyond) if beyond else "no field"),
    ]


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _interval(interval: tuple[float, float] | None) -> str:
    if interval is None:
        return ""
    return f" [{interval[0]:.3f}, {interval[1]:.3f}]" if has_spread(interval) else f" [{TOO_SMALL}]"


def noise_floor_hint(
    reference: str,
    candidate: str,
    sample: Sample | None,
    job: str,
    database: str | None = None,
    options: Sequence[str] = (),
) -> str:
    """Without a re-run of A: what the noise floor is, and the exact commands that measure it;
    ``options``: those A was made with (:func:`~pipeline.reports.variants.last_run_options`), which its
    re-run needs too."""
    asked = Asked(Path(job), Path(database) if database else None)
    sampled = ["--sample", str(sample.size), "--seed", str(sample.seed)] if sample else []
    run = asked.command("run", "--variant", reference, "--rerun", *options, *sampled)
    compare = asked.command("compare", "--variants", f"{reference},{candidate}", *sampled)
    return (
        f"noise floor: not measured ({rerun_name(reference)} has no results). Temperature 0 on vLLM is not "
        f"deterministic across batches, so a difference means something only above how much {reference} "
        f"differs from a re-run of itself: `{run}` (re-runs {reference} with its settings on the records "
        f"it extracted), then `{compare}`"
    )
