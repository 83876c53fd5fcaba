"""Judging a sample's extracted values: people on the judging page, a model by
:mod:`pipeline.judging.model`; what they say is stored as judgments (:mod:`pipeline.store.judgments`).

The human side (``pipeline judge``):

* :mod:`~pipeline.judging.session`: which records a judge reads and what there is to judge in each (one
  variant, or two blind), what the judge said so far and how far they are; :mod:`~pipeline.judging.state`:
  that judge's verdicts and the actions undo takes back;
* :mod:`~pipeline.judging.journal`: each judgment written at once, the database opened for each write
  and closed, or journaled beside it while a run holds it;
* :mod:`~pipeline.judging.views`: what the page is sent (the JSON API's bodies; never a variant's name
  when blind); :mod:`~pipeline.judging.server`: the page and its API on 127.0.0.1 (aiohttp's server:
  the one module here that imports aiohttp); ``page.html``: the page, one self-contained file;
* :mod:`~pipeline.judging.exchange`: judgments imported from a JSON lines file, and a gold file
  exported from the judged records (:mod:`~pipeline.judging.gold_records` builds its records).

May import: :mod:`pipeline.reports` (reading results, texts and samples), :mod:`pipeline.store`,
:mod:`pipeline.extraction`, :mod:`pipeline.source`, :mod:`pipeline.job`, :mod:`pipeline.servers`,
:mod:`pipeline.quality`, :mod:`pipeline.errors`.
"""
