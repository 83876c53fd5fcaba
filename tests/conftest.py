from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog

# Fails a test that starts a process without the `process` marker (`make check` leaves those out).
pytest_plugins = ["tests.support.process_guard"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _structlog_defaults() -> Iterator[None]:
    """Every test starts with structlog's defaults: a command run in-process configures logging for its
    level (bench: warnings only), which would hide from a later test's ``capture_logs`` what it logs."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()
