"""Logging setup, called once by the CLI: JSON lines without a terminal, readable lines with one (an
event that carries the line a person reads, ``said``, is that line alone there)."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:  # structlog and orjson load when logging is set up, not for `pipeline --help`
    import structlog

#: What ``--log-level`` accepts (in any case), from the most said to the least.
LOG_LEVELS = ("debug", "info", "warning", "error")


class _CurrentStderr:
    """Resolves ``sys.stderr`` at each write, so rich's live display can redirect it."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _json_renderer(_: Any, __: str, event: structlog.typing.EventDict) -> str:
    import orjson

    return orjson.dumps(event, default=str).decode()


#: The fields a terminal's line keeps of an event that says itself (``said``): when, how grave, whose.
_SAID_KEEPS = ("timestamp", "level", "logger")


def _said_alone(_: Any, __: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
    """On a terminal, an event that says itself for a person (``said``: a run's progress line) is that
    line alone; its record, every field, is the JSON log's."""
    said = event.pop("said", None)
    if said is None:
        return event
    return {key: event[key] for key in _SAID_KEEPS if key in event} | {"event": f"{event['event']}: {said}"}


def _said_dropped(_: Any, __: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
    """In the JSON log the record's fields say what ``said`` says: one copy."""
    event.pop("said", None)
    return event


def configure_logging(*, json_lines: bool, level: str = "info", stream: TextIO | None = None) -> None:
    import structlog

    renderer: structlog.typing.Processor = (
        _json_renderer if json_lines else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _said_dropped if json_lines else _said_alone,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=stream or _CurrentStderr()),  # type: ignore[arg-type]  # it wants a TextIO; it calls only write and flush
        cache_logger_on_first_use=False,
    )
