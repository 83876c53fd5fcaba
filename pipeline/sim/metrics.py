"""The simulator's ``/metrics``: vLLM's names, types and cache settings as vLLM writes them, then a few
of the simulator's own (``pipeline_sim:``).

vLLM 0.32's ``/metrics`` (the bundled server's) writes the counters with their ``_total`` in the
``# TYPE`` line, and its KV cache settings as the labels of ``vllm:cache_config_info``, a gauge of 1:
``num_gpu_blocks="546"``, ``block_size="128"``, ``enable_prefix_caching="True"`` (Python's ``str`` of
each setting; ``"None"`` for one that is unset), beside ``kv_cache_size_tokens``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pipeline.sim.blocks import BLOCK_SIZE

_VLLM_METRICS: tuple[tuple[str, str, str], ...] = (
    ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches."),
    ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
    ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."),
    ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed."),
    ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed."),
    ("vllm:request_success_total", "counter", "Count of successfully processed requests."),
    (
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
    ),
    ("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens."),
    ("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine."),
)
VLLM_METRIC_NAMES = tuple(name for name, _, _ in _VLLM_METRICS)


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """What ``vllm:cache_config_info`` says of the KV cache. ``kv_tokens`` None: the simulator without
    an engine holds no KV cache, and says its size is unset as vLLM says of an unset number."""

    kv_tokens: int | None
    prefix_caching: bool
    block_size: int = BLOCK_SIZE

    def labels(self) -> dict[str, str]:
        blocks = None if self.kv_tokens is None else self.kv_tokens // self.block_size
        return {
            "block_size": str(self.block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": str(self.prefix_caching),
            "engine": "0",
            "gpu_memory_utilization": "0.9",
            "kv_cache_size_tokens": str(None if blocks is None else blocks * self.block_size),
            "num_gpu_blocks": str(blocks),
        }


def vllm_metrics(model: str, values: Mapping[str, float], cache: CacheConfig) -> str:
    """vLLM's metrics, each with its ``# HELP`` and ``# TYPE`` (``values`` by name), and the cache
    settings' info gauge."""
    label = f'{{model_name="{model}"}}'
    lines = []
    for name, kind, text in _VLLM_METRICS:
        lines += [f"# HELP {name} {text}\n", f"# TYPE {name} {kind}\n", f"{name}{label} {values[name]}\n"]
    info = ",".join(f'{key}="{value}"' for key, value in sorted(cache.labels().items()))
    lines += [
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n",
        "# TYPE vllm:cache_config_info gauge\n",
        f"vllm:cache_config_info{{{info}}} 1.0\n",
    ]
    return "".join(lines)
