"""The source: the job's DuckDB database as input, and what a run has to do.

Owns the DuckDB boundary (:mod:`pipeline.source.db`: opening, identifier quoting, parameters, error
translation), the one-run-per-job lock, loading files into the source table, the source relation,
the version key of a result and its staleness (:mod:`pipeline.source.versions`), which records are
pending (:mod:`pipeline.source.pending`, the SQL), which have nothing to extract from
(:mod:`pipeline.source.blank`) and the stream that reads them (:mod:`pipeline.source.reader`).

May import: :mod:`pipeline.job`, :mod:`pipeline.servers` (through the job), :mod:`pipeline.errors`.
"""
