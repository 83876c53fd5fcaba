"""Extraction: one record in, one classified outcome out.

Owns the prompt (what is sent, and what every request to an endpoint carries), parsing and validating
replies, re-asks, the one retry policy, whether a prompt fits the context, and the extractor that runs
a record end to end through the router; for a long record (``chunking:``), its chunks, their passes
and their merge (the document extractor, :mod:`~pipeline.extraction.merging`: the chunk answers field by
field, by the strategies the job names). Outcomes (a result, a failure, a finished chunk) are what it
hands the store; :mod:`~pipeline.extraction.outcomes` loads neither DuckDB nor the HTTP client.

May import: :mod:`pipeline.source` (the records it is given), :mod:`pipeline.job`,
:mod:`pipeline.servers`, :mod:`pipeline.quality` (grounding each answer, and the merging's field kinds,
value keys and grounded values), :mod:`pipeline.errors`.
"""
