"""Helpers for the tests that run the real local vLLM server."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import pytest


def require_local_vllm() -> None:
    """Skip without the `local` extra, unless CI demands it (PIPELINE_REQUIRE_LOCAL_VLLM=1): then fail."""
    if importlib.util.find_spec("vllm") is not None:
        return
    message = "the local extra is not installed (make setup)"
    if os.environ.get("PIPELINE_REQUIRE_LOCAL_VLLM") == "1":
        pytest.fail(message)
    pytest.skip(message)


#: What the `local` extra installs, as pipeline.local checks for it.
LOCAL_EXTRA = ("vllm", "torch", "transformers", "gguf", "accelerate", "safetensors")


def hide_the_local_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """None of the `local` extra installed, as far as pipeline.local can tell, whether this venv has it
    (make setup's) or not (a venv of the dev and bench extras): its message is the same in both."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *rest: None if name in LOCAL_EXTRA else real(name, *rest)
    )


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def wait_gone(pgid: int, timeout_s: float = 45.0) -> None:
    """Every process of the server's group (API server, engine, worker) must be gone."""
    deadline = time.monotonic() + timeout_s
    while (left := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"processes left behind: {left}"
