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
* :mod:`~pipeline.quality.gold`: reading a gold file; :mod:`~pipeline.quality.json_files`: reading a file
  of JSON objects (a gold file, judgments to import, few-shot examples), each with its line;
* :mod:`~pipeline.quality.grounding`: locating values in the record text, and the one grounded-value
  type with its stored JSON form (written by the extractor, read by reports and the merging).

The package imports none of its modules: a caller imports the one it needs, so that importing
:mod:`~pipeline.quality.fields` (as the job spec does) does not load rapidfuzz or NumPy.

May import: :mod:`pipeline.errors` only (and NumPy, only in bootstrap, intervals, judged_scores and ppi,
inside the functions that draw intervals).
"""
