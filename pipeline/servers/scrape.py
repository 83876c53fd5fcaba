"""Reading a vLLM server's Prometheus ``/metrics``: the one parser, for the concurrency sweep and for the
adaptive limit of a run's endpoints."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from pipeline.servers.window import ServerLoad

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"  # vLLM before 0.10
PREEMPTIONS = "vllm:num_preemptions"
GAUGES = (RUNNING, WAITING, KV_USAGE)
COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:generation_tokens", PREEMPTIONS)
CACHE_CONFIG_INFO = "vllm:cache_config_info"  # a gauge of 1 whose labels are the KV cache's settings
#: The names, as vLLM's ``/metrics`` writes them, that this code reads (a test checks the real server's):
#: the counters with their ``_total``, and the cache settings' labels after the info gauge's name.
RELIED_ON = (
    *GAUGES,
    *(f"{name}_total" for name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", PREEMPTIONS)),
    CACHE_CONFIG_INFO,
)
CACHE_CONFIG_LABELS = ("num_gpu_blocks", "block_size", "enable_prefix_caching")
# The simulator's time compression: bench scales its clock back so the numbers read as the model's.
SPEED = "pipeline_sim:speed"
_KNOWN = {*GAUGES, *COUNTERS, SPEED, KV_USAGE_OLD}


def metrics_url(base_url: str) -> str:
    """vLLM serves ``/metrics`` beside ``/v1``."""
    return base_url.rstrip("/").removesuffix("/v1") + "/metrics"


def parse_metrics(text: str) -> dict[str, float]:
    """Sum each vLLM metric over its labels (one engine or several); counters without ``_total``."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name in _KNOWN:
                values[name] = values.get(name, 0.0) + float(sample.value)
    if KV_USAGE not in values and KV_USAGE_OLD in values:
        values[KV_USAGE] = values[KV_USAGE_OLD]
    return values


def server_load(values: dict[str, float]) -> ServerLoad:
    """What the adaptive limit reads from one scrape (None where the server does not say)."""
    return ServerLoad(
        running=values.get(RUNNING),
        waiting=values.get(WAITING),
        kv_usage=values.get(KV_USAGE),
        preemptions_total=values.get(PREEMPTIONS),
    )


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """vLLM's KV cache settings from ``vllm:cache_config_info``; None where a label is missing or not a
    number (vLLM writes ``None`` for blocks not yet profiled)."""

    num_gpu_blocks: int | None
    block_size: int | None
    prefix_caching: bool | None

    @property
    def kv_tokens(self) -> int | None:
        """The tokens the KV cache holds: blocks x tokens per block."""
        if self.num_gpu_blocks is None or self.block_size is None:
            return None
        return self.num_gpu_blocks * self.block_size


def parse_cache_config(text: str) -> CacheConfig | None:
    """The KV cache settings a ``/metrics`` text gives, or None without ``vllm:cache_config_info``.
    Several engines (data parallel) each write theirs: their blocks add up, as their caches do."""
    samples = [
        sample.labels
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == CACHE_CONFIG_INFO
    ]
    if not samples:
        return None
    blocks = [_label_int(labels.get("num_gpu_blocks")) for labels in samples]
    prefix = str(samples[0].get("enable_prefix_caching", "")).lower()
    return CacheConfig(
        num_gpu_blocks=sum(b for b in blocks if b is not None)
        if all(b is not None for b in blocks)
        else None,
        block_size=_label_int(samples[0].get("block_size")),
        prefix_caching={"true": True, "false": False}.get(prefix),
    )


def _label_int(value: str | None) -> int | None:
    try:
        number = int(value) if value is not None else None
    except ValueError:
        return None
    return number if number is not None and number > 0 else None
