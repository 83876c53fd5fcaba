"""The model servers: the HTTP boundary, and everything about talking to OpenAI-compatible servers.

Owns every HTTP client of the pipeline (:mod:`pipeline.servers.http` makes them), the LLM client
(the one place that sends requests and translates SDK/HTTP errors), the endpoint settings
(``endpoint:`` / ``endpoints:``), one endpoint's health and limit (server health lives in
:mod:`pipeline.servers.endpoint`), routing and failover, ``concurrency: auto`` (the adaptive limit and
its knee search), and reading a vLLM server's ``/metrics``. It knows servers, not jobs: it takes
settings, never a job spec.

May import: :mod:`pipeline.errors`.
"""
