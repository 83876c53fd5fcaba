"""What a run decides once from its job, at the composition root: the spec as it runs, its version key
and its servers. The stages below take these values; none of them re-derives them from the spec."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.job.spec import JobSpec
from pipeline.servers.config import EndpointConfig
from pipeline.source.pending import PendingQueries, Selection
from pipeline.source.versions import JobVersion, version_of


@dataclass(frozen=True, slots=True)
class RunContext:
    spec: JobSpec
    version: JobVersion  # hashes the prompt, the schema and the settings: computed once here
    endpoints: tuple[EndpointConfig, ...]

    @classmethod
    def of(cls, spec: JobSpec) -> RunContext:
        return cls(spec, version_of(spec), tuple(spec.endpoint_configs()))

    def running(self, spec: JobSpec) -> RunContext:
        """The context of the spec as it runs: the fleet may have pointed it at a server it started."""
        return self if spec is self.spec else RunContext.of(spec)

    @property
    def auto(self) -> bool:
        """Whether some endpoint's concurrency is ``auto``."""
        return any(config.concurrency is None for config in self.endpoints)

    @property
    def most_in_flight(self) -> int:
        return max(config.most_in_flight for config in self.endpoints)

    def pending(self, selection: Selection) -> PendingQueries:
        return PendingQueries(self.spec, self.version, selection)
