"""What a run decides once from its job, at the composition root: the spec as it runs, its version key,
its servers and its prompts. The stages below take this context; none of them re-derives these values
from the spec (the version hashes the prompt and the schema: computed once here, not per component).

It sits with extraction because the prompts are extraction's, and both the store (which writes each
result under the version key) and the run (which puts the stages together) stand above it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.extraction.prompt import PromptBuilder, client_settings
from pipeline.job.spec import JobSpec
from pipeline.servers.client import ClientSettings
from pipeline.servers.config import EndpointConfig
from pipeline.source.pending import PendingQueries, Selection
from pipeline.source.versions import JobVersion, version_of


@dataclass(frozen=True, slots=True)
class RunContext:
    spec: JobSpec
    version: JobVersion
    endpoints: tuple[EndpointConfig, ...]
    prompts: PromptBuilder

    @classmethod
    def of(cls, spec: JobSpec) -> RunContext:
        return cls(spec, version_of(spec), tuple(spec.endpoint_configs()), PromptBuilder(spec))

    def running(self, spec: JobSpec) -> RunContext:
        """The context of the spec as it runs: the fleet may have pointed it at a server it started."""
        return self if spec is self.spec else RunContext.of(spec)

    @property
    def database(self) -> Path:
        return self.spec.database

    @property
    def auto(self) -> bool:
        """Whether some endpoint's concurrency is ``auto``."""
        return any(config.concurrency is None for config in self.endpoints)

    @property
    def most_in_flight(self) -> int:
        return max(config.most_in_flight for config in self.endpoints)

    def client_settings(self, config: EndpointConfig) -> ClientSettings:
        return client_settings(self.spec, config)

    def pending(self, selection: Selection) -> PendingQueries:
        return PendingQueries(self.spec, self.version, selection)
