"""``pipeline bench --job JOB``: the sweep with the job's own requests: its system prompt, examples,
schema, settings and a seeded sample of its records, instead of synthetic prompts of a fixed size."""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.bench.load import BenchOptions
from pipeline.errors import ConfigError
from pipeline.extraction.prompt import PromptBuilder, client_settings
from pipeline.job.spec import JobSpec
from pipeline.servers.client import LLMClient
from pipeline.source.pending import sampled_fields
from pipeline.store.opening import open_for_reading

SAMPLE_SEED = 0


def job_requests(spec: JobSpec, records: int) -> list[dict[str, Any]]:
    """The request bodies the job would send for a seeded sample of ``records`` of its source."""
    connection = open_for_reading(spec)
    try:
        fields = sampled_fields(connection, spec, records, SAMPLE_SEED)
    finally:
        connection.close()
    if not fields:
        raise ConfigError(f"{spec.source_file}: the source has no records to send")
    prompts = PromptBuilder(spec)
    client = LLMClient(client_settings(spec))  # only to build the bodies: it sends nothing
    return [client.request_body(prompts.request_for(record)) for record in fields]


def with_job(options: BenchOptions, spec: JobSpec, records: int) -> BenchOptions:
    """``options`` sending the job's requests, to the job's first endpoint unless one was given."""
    endpoint = spec.endpoint_configs()[0]
    return dataclasses.replace(
        options,
        base_url=options.base_url or endpoint.base_url,
        model=options.model or endpoint.model,
        output_tokens=spec.max_tokens,
        api_key=options.api_key or spec.api_key(endpoint.api_key_env),
        job_bodies=tuple(job_requests(spec, records)),
    )
