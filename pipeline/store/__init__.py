"""The store: the job's DuckDB database as output.

Owns the output tables (results, their history, failures, runs, the chunks of long records) and their
upgrade, opening the database for a run or for reading, the single batched writer, and the progress
snapshot a run leaves beside the database.

May import: :mod:`pipeline.extraction` (the outcomes it writes, and the run's context whose version key
it writes them under), :mod:`pipeline.source`, :mod:`pipeline.job`, :mod:`pipeline.servers` (the knee a
run found, an endpoint's settings, the model's reply in a kept chunk), :mod:`pipeline.quality` (a run's
profile, judgments), :mod:`pipeline.errors`.
"""
