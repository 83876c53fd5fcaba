"""Measuring extractions: agreement with a gold file or between two variants, and grounding of
extracted values in the record text. Pure functions over plain data: no DuckDB, no network; the CLI
reads the results and calls these.

* :mod:`~pipeline.quality.fields`: what a schema's fields are (kinds, sub-fields, grounded paths);
* :mod:`~pipeline.quality.normalize`: the one text normalisation everything compares with;
* :mod:`~pipeline.quality.matching`: whether two values match (settings, keys, one-to-one lists);
* :mod:`~pipeline.quality.agreement`: measuring field-by-field agreement;
* :mod:`~pipeline.quality.scores`: what it reports, as JSON and as a table;
* :mod:`~pipeline.quality.bootstrap`, :mod:`~pipeline.quality.intervals`: bootstrap intervals of every
  score, paired differences with a verdict, and the noise floor (NumPy, imported only there);
* :mod:`~pipeline.quality.judgments`: what a judge says of one value; :mod:`~pipeline.quality.judged_scores`:
  precision and recall of a run from judged values, intervals over records, two variants paired;
  :mod:`~pipeline.quality.ppi`: a model judge calibrated by people (prediction-powered inference);
* :mod:`~pipeline.quality.profile`, :mod:`~pipeline.quality.drift`: a run's profile and what drifted
  across runs;
* :mod:`~pipeline.quality.gold`: reading a gold file;
* :mod:`~pipeline.quality.grounding`: locating values in the record text;
* :mod:`~pipeline.quality.merging`: merging a long document's chunk answers field by field;
* :mod:`~pipeline.quality.review_page`: the self-contained HTML review page;
  :mod:`~pipeline.quality.html_page`: what every self-contained page shares (embedded data, CSP,
  atomic write);
* :mod:`~pipeline.quality.skillspan`: the SkillSpan gold set, converted to records and a gold file
  (``python -m pipeline.quality.skillspan``).

May import: :mod:`pipeline.errors` only (and NumPy, only in bootstrap, intervals, judged_scores and ppi,
inside the functions that draw intervals).
"""

from __future__ import annotations

from pipeline.quality.agreement import measure_agreement, record_key
from pipeline.quality.fields import (
    FieldKind,
    FieldSpec,
    ScoredPath,
    grounded_paths,
    raw_values_at,
    schema_fields,
    scored_paths,
    values_at,
)
from pipeline.quality.gold import Gold, read_gold
from pipeline.quality.grounding import GroundedValue, Grounding, MatchKind, ground
from pipeline.quality.matching import MatchSettings, Scores
from pipeline.quality.normalize import (
    NORMALISATION_RULE,
    NormalizedText,
    normalize_text,
    normalize_with_offsets,
)
from pipeline.quality.scores import (
    AgreementReport,
    FieldDifference,
    FieldScore,
    RecordAgreement,
    format_table,
)

__all__ = [
    "NORMALISATION_RULE",
    "AgreementReport",
    "FieldDifference",
    "FieldKind",
    "FieldScore",
    "FieldSpec",
    "Gold",
    "GroundedValue",
    "Grounding",
    "MatchKind",
    "MatchSettings",
    "NormalizedText",
    "RecordAgreement",
    "ScoredPath",
    "Scores",
    "format_table",
    "ground",
    "grounded_paths",
    "measure_agreement",
    "normalize_text",
    "normalize_with_offsets",
    "raw_values_at",
    "read_gold",
    "record_key",
    "schema_fields",
    "scored_paths",
    "values_at",
]
