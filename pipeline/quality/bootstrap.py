"""Bootstrap intervals over records: how far a score would move had other records been drawn.

Every score of :mod:`pipeline.quality.agreement` is a ratio of sums over records: accuracy is matches
over scored records, micro F1 is 2·TP over reference plus candidate items, macro F1 is the sum of each
record's F1 over the scored records. So a score is a function of a few per-record columns
(:data:`~pipeline.quality.scores.COLUMNS`), and a resample (n records drawn with replacement) changes
only how often each record counts. With those counts as a weight matrix W (resamples x records), the
sums of every resample are one matrix product W·X, and the scores follow from the sums without a
Python loop per resample: 1,000 resamples of 10^5 records take seconds (``benchmarks/bootstrap.py``).

The interval is the percentile interval of the resampled scores. Two measurements over the same
records (two variants against one gold file, or A against B beside A against its re-run) are resampled
with the *same* weights, so the interval of their difference is paired: what the two have in common
cancels out, which is what makes a difference of a few points on a few hundred records detectable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING

from pipeline.defaults import DEFAULT_BOOTSTRAP_SEED, DEFAULT_RESAMPLES
from pipeline.errors import ConfigError
from pipeline.quality.scores import CANDIDATE, EXACT, F1, PRECISION, RECALL, REFERENCE, SCORED, TP, Interval

DEFAULT_CONFIDENCE = 0.95
# Cells of one block of the weight matrix (float32): 8·10^6 cells are 32 MB, whatever the records.
_BLOCK_CELLS = 8_000_000

if TYPE_CHECKING:  # NumPy is imported by what draws intervals, not by every command that loads this
    import numpy as np
    import numpy.typing as npt

    Array = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """How intervals are drawn: resamples, their seed (the same seed, the same intervals) and the
    confidence level."""

    resamples: int = DEFAULT_RESAMPLES
    seed: int = DEFAULT_BOOTSTRAP_SEED
    confidence: float = DEFAULT_CONFIDENCE

    def __post_init__(self) -> None:
        if self.resamples < 100:
            raise ConfigError(
                f"resamples {self.resamples}: give at least 100 (1,000 or more for a 95% interval)"
            )
        if not 0.5 <= self.confidence < 1:
            raise ConfigError(f"confidence {self.confidence}: give a level from 0.5 to below 1 (0.95: 95%)")

    def describe(self) -> str:
        return (
            f"{self.confidence:.0%} intervals: percentile bootstrap over records, "
            f"{self.resamples:,} resamples, seed {self.seed}"
        )

    def resampled_sums(self, columns: npt.ArrayLike) -> Array:
        """The column sums of every resample (resamples x columns) of ``columns`` (records x columns).
        The same seed and number of records give the same resamples, whatever the columns: that is what
        pairs two measurements."""
        import numpy as np

        values = np.asarray(columns, dtype=np.float32)
        records = values.shape[0]
        sums = np.zeros((self.resamples, values.shape[1]), dtype=np.float64)
        if records == 0:
            return sums
        rng = np.random.default_rng(self.seed)
        block = max(1, min(self.resamples, _BLOCK_CELLS // records))
        for start in range(0, self.resamples, block):
            size = min(block, self.resamples - start)
            draws = rng.integers(0, records, size=(size, records))
            draws += np.arange(size)[:, None] * records  # one bin range per resample
            weights = np.bincount(draws.ravel(), minlength=size * records).reshape(size, records)
            sums[start : start + size] = weights.astype(np.float32) @ values
        return sums

    def swapped_sums(self, first: npt.ArrayLike, second: npt.ArrayLike) -> tuple[Array, Array]:
        """The column sums of ``first`` and ``second`` (records x columns each, paired by row) when each
        record's two rows trade places with probability 1/2, in every resample: what a paired
        comparison looks like when the two sides are interchangeable (no difference between them)."""
        import numpy as np

        a, b = (np.asarray(side, dtype=np.float32) for side in (first, second))
        records = a.shape[0]
        delta = b - a
        moved = np.zeros((self.resamples, a.shape[1]), dtype=np.float64)
        rng = np.random.default_rng([self.seed, 1])  # not the resamples' stream
        block = max(1, min(self.resamples, _BLOCK_CELLS // max(records, 1)))
        for start in range(0, self.resamples if records else 0, block):
            size = min(block, self.resamples - start)
            flips = rng.integers(0, 2, size=(size, records)).astype(np.float32)
            moved[start : start + size] = flips @ delta
        return a.sum(axis=0) + moved, b.sum(axis=0) - moved

    def interval(self, values: Array, records: int = 0) -> Interval | None:
        """The percentile interval of resampled scores; None when most resamples have no score (no
        record scored). A perfect or a zero score over ``records`` records gives every resample the same
        score: then the exact binomial bound (:func:`all_alike_bound`) says how far it may be from 1 or 0."""
        import numpy as np

        finite = values[np.isfinite(values)]
        if finite.size < max(1, values.size // 2):
            return None
        tail = (1 - self.confidence) / 2
        low, high = (float(bound) for bound in np.quantile(finite, [tail, 1 - tail]))
        if low == high and low in (0.0, 1.0) and (share := all_alike_bound(records, self.confidence)):
            return (1.0 - share, 1.0) if low == 1.0 else (0.0, share)
        return (low, high)

    @property
    def z(self) -> float:
        """The normal quantile of the two-sided level (1.96 at 95%)."""
        return two_sided_z(self.confidence)

    def simultaneous(self, count: int) -> float:
        """The level each of ``count`` intervals needs for all of them to cover together at
        :attr:`confidence` (Bonferroni)."""
        return 1 - (1 - self.confidence) / max(count, 1)


#: Fewer records than this that all score alike say nothing a bound could add: "sample too small".
MIN_RECORDS_FOR_BOUND = 2


def all_alike_bound(records: int, confidence: float) -> float | None:
    """When all of ``records`` records scored alike (all right, or all wrong), the largest share of
    records that could score otherwise at ``confidence``: the exact (Clopper-Pearson) bound at 0 of n,
    1 - (tail)^(1/n). 200 records all right: at least 98.2% at 95%. Resampling cannot show this: every
    resample of such records gives the same score. None for too few records to say anything."""
    if records < MIN_RECORDS_FOR_BOUND:
        return None
    tail = (1 - confidence) / 2
    return 1.0 - float(tail ** (1 / records))


def two_sided_z(level: float) -> float:
    return NormalDist().inv_cdf(1 - (1 - level) / 2)


def ratio(numerator: Array, denominator: Array) -> Array:
    """``numerator / denominator`` element by element, NaN where the denominator is 0 (no score)."""
    import numpy as np

    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denominator > 0, numerator / np.where(denominator > 0, denominator, 1), np.nan)


def list_ratios(tp: Array, reference: Array, candidate: Array) -> tuple[Array, Array, Array]:
    """Micro precision, recall and F1 from pooled counts, by the rule of
    :func:`~pipeline.quality.matching.list_scores`: both sides empty is 1; a ratio over an empty side
    is 0 when the other side is not."""
    import numpy as np

    both_empty = (reference == 0) & (candidate == 0)
    precision = np.where(both_empty, 1.0, np.nan_to_num(ratio(tp, candidate), nan=0.0))
    recall = np.where(both_empty, 1.0, np.nan_to_num(ratio(tp, reference), nan=0.0))
    f1 = np.where(both_empty, 1.0, ratio(2 * tp, reference + candidate))
    return precision, recall, f1


def path_scores(sums: Array, is_list: bool) -> dict[str, Array]:
    """Every score of one path from its column sums (``sums[..., COLUMN]``), by the names the report
    uses; NaN where no record is scored."""
    import numpy as np

    scored = sums[..., SCORED]
    none = scored <= 0
    if not is_list:
        accuracy = ratio(sums[..., TP], scored)
        return {"agreement": accuracy, "accuracy": accuracy, "exact": ratio(sums[..., EXACT], scored)}
    precision, recall, f1 = list_ratios(sums[..., TP], sums[..., REFERENCE], sums[..., CANDIDATE])
    scores = {"agreement": f1, "precision": precision, "recall": recall, "f1": f1}
    scores |= {f"macro_{name}": ratio(sums[..., index], scored) for name, index in _MACRO.items()}
    return {name: np.where(none, np.nan, value) for name, value in scores.items()}


_MACRO = {"precision": PRECISION, "recall": RECALL, "f1": F1}


def records_to_detect(
    records: int, difference: float, standard_error: float, z: float, power: float = 0.8
) -> int | None:
    """About how many records it takes to tell ``difference`` from 0 (an interval of ±z standard errors
    that excludes it) with the given power, from the standard error at ``records`` (it shrinks as
    1/√n). None for no difference."""
    if records <= 0 or difference == 0 or not math.isfinite(difference) or not math.isfinite(standard_error):
        return None
    if standard_error <= 0:
        return records
    needed = records * ((z + NormalDist().inv_cdf(power)) * standard_error / abs(difference)) ** 2
    return max(1, math.ceil(needed))
