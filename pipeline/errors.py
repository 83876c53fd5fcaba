"""Every error the pipeline raises, split by how the caller reacts to it.

::

    PipelineError
    ├── FatalRunError            abort the whole run early, with one clear message (exit code 3 unless below)
    │   ├── ConfigError          bad job, option, input file or database (exit code 2, before any request)
    │   │   ├── SourceMissingError   the source is not in the database
    │   │   └── ModelNotServedError  the server does not serve the job's model
    │   ├── DatabaseLockedError  another process holds the job's database
    │   │   └── AlreadyRunningError  another ``pipeline run`` of the same job is running (exit code 4;
    │   │                            3 for a command that only reads the database)
    │   ├── DatabaseError        DuckDB failed a statement (out of memory: exit code 2, the job's
    │   │                        duckdb_memory_limit; a missing table, I/O, the disk full...)
    │   ├── StalledRunError      requests in flight, none answered for too long (the watchdog: exit code 5)
    │   ├── ServerDownError      the server stayed unreachable past operations.server_down_abort_s
    │   ├── AnswersRejectedError the server answers, but a window of its answers failed validation
    │   ├── EndpointUnreachableError  the server did not answer before the run (refused, or silent)
    │   └── LocalServerError     the embedded vLLM server cannot be installed, started or reached
    │       └── LocalNotInstalledError  the ``local`` extra is missing or broken (also a ConfigError)
    ├── StructuredOutputRejectedError  the server refused ``response_format``: sent without it
    └── RecordError              about one record; the run goes on
        ├── TransientError       retry the same request after backoff (timeouts, resets, 408/429/5xx)
        │   ├── ServerUnreachableError  refused: the request goes to another endpoint, at no cost
        │   └── ConnectionLostError     broke mid-request: at no cost if a probe finds the server gone
        ├── BadOutputError       re-ask the model (the reply arrived but is unusable)
        │   ├── InvalidJSONError
        │   ├── SchemaInvalidError
        │   ├── EmptyOutputError
        │   └── TruncatedError   retry with a larger token budget (finish_reason "length")
        │       └── RepetitionLoopError  cut off in a loop: re-ask for a shorter answer instead
        ├── ContextFullError     an answer cut off with every token the context left it: truncated
        ├── TooLongError         the prompt alone does not fit the context: never sent, not retried
        └── PermanentRecordError record the failure, do not retry (400, 413, 422)
            └── ContextLengthError  a 400 naming the context: retried once with a budget that fits

Every exit code is decided in one place, :func:`exit_code_for`: of the fatal error that ended a
command, or of how it ended without one (an :class:`Ending`: a run's status, a check's verdict, a
drift, the model judge's failures, an interrupt). Every command takes its code from there.

Library errors (openai, httpx2, pydantic, duckdb) are translated into these once, at the boundary
where they are caught (DuckDB's in :mod:`pipeline.source.db`, the server's in
:mod:`pipeline.servers.client`), with ``raise ... from``. Messages never contain record text or API keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # every module imports this one: pydantic loads with what validates, not for `--help`
    from pydantic import ValidationError

T = TypeVar("T", bound=BaseException)


class FailureClass(StrEnum):
    """How a record ended when it did not produce a result; stored in the failures table."""

    INVALID_JSON = "invalid_json"
    SCHEMA_INVALID = "schema_invalid"
    TRUNCATED = "truncated"
    TOO_LONG = "too_long"  # the prompt does not fit the model's context: never sent
    EMPTY = "empty"
    TRANSIENT = "transient"
    PERMANENT = "permanent"


#: Exit codes of the ``pipeline`` command, for cron and systemd (docs/running.md, "Exit codes"), each
#: given by :func:`exit_code_for` and by nothing else.
EXIT_FAILURES = 1  # completed, but some records failed (see `pipeline failures`)
EXIT_CONFIG = 2  # the job, an input or the model name is wrong: nothing was sent
EXIT_ABORTED = 3  # the run stopped early (server down, database error): run again to resume
EXIT_ALREADY_RUNNING = 4  # another `pipeline run` of this job holds it
EXIT_STALLED = 5  # the stall watchdog ended the run (operations.stall_abort_s)
EXIT_INTERRUPTED = 130  # SIGINT/SIGTERM: finished records were saved


class Ending(StrEnum):
    """How a command ended when no fatal error ended it; :func:`exit_code_for` gives its code."""

    DONE = "done"  # all done, or nothing to do; a check all ok; no drift for the worse
    FAILURES = "failures"  # finished, but some records failed (a run's, the model judge's)
    CHECK_WARNED = "check_warned"  # `pipeline check` warned: a run would go, not well
    CHECK_FAILED = "check_failed"  # `pipeline check` failed a check: a run would be aborted
    DRIFTED = "drifted"  # `report --fail-on-drift`: the newest run drifted for the worse
    INTERRUPTED = "interrupted"  # SIGINT/SIGTERM or Ctrl-C: what finished is saved


_ENDING_CODES: Mapping[Ending, int] = {
    Ending.DONE: 0,
    Ending.FAILURES: EXIT_FAILURES,
    Ending.CHECK_WARNED: EXIT_FAILURES,
    Ending.CHECK_FAILED: EXIT_ABORTED,  # what the run it foresees would end with
    Ending.DRIFTED: EXIT_FAILURES,
    Ending.INTERRUPTED: EXIT_INTERRUPTED,
}


#: Failure classes a plain re-run does not retry (``--retry-failed`` does). Transient failures are
#: not in here: they say nothing about the record, so the next run tries them again.
PERMANENT_FAILURE_CLASSES: frozenset[FailureClass] = frozenset(FailureClass) - {FailureClass.TRANSIENT}

#: Failure classes that say the server's answer could not be used (it answered: not a network or HTTP
#: failure, nor a prompt never sent): what the run's answer breaker (pipeline.run.answer_breaker) counts.
ANSWER_FAILURE_CLASSES: frozenset[FailureClass] = frozenset(
    {FailureClass.INVALID_JSON, FailureClass.SCHEMA_INVALID, FailureClass.EMPTY, FailureClass.TRUNCATED}
)


class PipelineError(Exception):
    """Base of every error raised on purpose by this package."""


class FatalRunError(PipelineError):
    """Going on would fail every remaining record the same way: stop the run."""


class ConfigError(FatalRunError):
    """The job spec, an input file or the database is wrong; nothing was sent to the server."""


class SourceMissingError(ConfigError):
    """The source is not in the database (its table, or a table its query reads): a run cannot start,
    but a reader still shows what the database holds."""


class DatabaseLockedError(FatalRunError):
    """Another process (usually a running ``pipeline run``) holds the database's write lock."""


class DatabaseFailure(StrEnum):
    """How a DuckDB statement failed, for the caller that words the error."""

    OUT_OF_MEMORY = "out_of_memory"  # past duckdb_memory_limit
    MISSING = "missing"  # a table, column or function that does not exist
    IO = "io"  # the file could not be read or written
    DISK_FULL = "disk_full"  # no space left on the device that holds the file (or its WAL)
    INVALID = "invalid"  # SQL DuckDB cannot parse or bind
    OTHER = "other"


class DatabaseError(FatalRunError):
    """DuckDB failed a statement. Raised only by :mod:`pipeline.source.db`, the one place DuckDB's own
    exceptions are caught; ``reason`` is DuckDB's message in one line, without record text."""

    def __init__(self, reason: str, *, kind: DatabaseFailure, database: Path | None = None) -> None:
        where = f"{database}: " if database is not None else ""
        hint = "; raise duckdb_memory_limit in the job" if kind is DatabaseFailure.OUT_OF_MEMORY else ""
        if kind is DatabaseFailure.DISK_FULL:  # the reason says so first: DuckDB did nothing wrong
            super().__init__(f"{where}{reason}; free space and run again (what was committed is kept)")
        else:
            super().__init__(f"{where}DuckDB failed ({reason}){hint}")
        self.reason = reason
        self.kind = kind
        self.database = database


class ModelNotServedError(ConfigError):
    """``/v1/models`` does not list the job's model (a typo, or the server serves another one)."""


class AlreadyRunningError(DatabaseLockedError):
    """The job's run lock is held: another ``pipeline run`` of this job is running."""

    def __init__(self, message: str, *, pid: int | None) -> None:
        super().__init__(message)
        self.pid = pid


class StalledRunError(FatalRunError):
    """Requests were in flight but the server finished none of them for ``stall_abort_s``."""


class ServerDownError(FatalRunError):
    """Every endpoint went away mid-run and none came back within ``server_down_abort_s``."""


class AnswersRejectedError(FatalRunError):
    """The server answers, but the records of a window all failed on their answers (or their valid
    share collapsed against the run so far): a wrong chat template, reasoning parser or model would
    otherwise mark the whole backlog failed (:mod:`pipeline.run.answer_breaker`)."""


class EndpointUnreachableError(FatalRunError):
    """The server did not answer the preflight (refused, or silent past ``preflight_timeout_s``)."""


class LocalServerError(FatalRunError):
    """The embedded local vLLM server is not installed, cannot start, or died."""


class LocalNotInstalledError(LocalServerError, ConfigError):
    """The ``local`` extra is not installed, or with builds that break vLLM: a configuration error
    (exit 2), since nothing was started or sent."""


class RecordError(PipelineError):
    """Something went wrong for one record; the other records are unaffected."""

    failure_class: FailureClass = FailureClass.PERMANENT


class TransientError(RecordError):
    """The server or the network failed; the same request may succeed later."""

    failure_class = FailureClass.TRANSIENT

    def __init__(self, message: str, *, retry_after: float | None = None, timed_out: bool = False) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.timed_out = timed_out


class ServerUnreachableError(TransientError):
    """No connection could be made at all (refused, DNS, unreachable)."""


class ConnectionLostError(TransientError):
    """The connection broke mid-request (reset, closed): one request's bad luck, or the server gone."""


class StructuredOutputRejectedError(PipelineError):
    """The server refused ``response_format`` (HTTP 400 naming it): send without it, at no cost."""


class BadOutputError(RecordError):
    """The server answered, but the answer cannot be used as it is."""

    def __init__(self, message: str, *, raw_output: str | None = None) -> None:
        super().__init__(message)
        self.raw_output = raw_output


class InvalidJSONError(BadOutputError):
    failure_class = FailureClass.INVALID_JSON


class SchemaInvalidError(BadOutputError):
    failure_class = FailureClass.SCHEMA_INVALID


class EmptyOutputError(BadOutputError):
    failure_class = FailureClass.EMPTY


class TruncatedError(BadOutputError):
    """The token budget ran out (often spent on reasoning) before the answer was complete."""

    failure_class = FailureClass.TRUNCATED


class RepetitionLoopError(TruncatedError):
    """The budget ran out while the answer repeated itself: a larger budget only buys a longer loop.
    ``unit`` is what repeated; ``loop_start`` where the loop begins in ``raw_output`` (None: in the
    reasoning)."""

    def __init__(
        self, message: str, *, raw_output: str | None, unit: str, loop_start: int | None = None
    ) -> None:
        super().__init__(message, raw_output=raw_output)
        self.unit = unit
        self.loop_start = loop_start


class ContextFullError(RecordError):
    """An answer cut off already had every token the context leaves after its prompt: a larger budget
    does not fit. Class ``truncated``, with the numbers."""

    failure_class = FailureClass.TRUNCATED


class TooLongError(RecordError):
    """The record's prompt alone does not fit the model's context (``tokens`` against ``context``; the
    server's count when ``exact``), so it is not sent: class ``too_long``. ``field`` is the prompt field
    with the most text (what chunking would split, or what to shorten), ``None`` when unknown;
    ``answer_cut_at``: the tokens its answer was cut off at with all the room the context left."""

    failure_class = FailureClass.TOO_LONG

    def __init__(
        self,
        message: str,
        *,
        tokens: int,
        context: int,
        exact: bool,
        field: str | None = None,
        answer_cut_at: int | None = None,
    ) -> None:
        super().__init__(message)
        self.tokens = tokens
        self.context = context
        self.exact = exact
        self.field = field
        self.answer_cut_at = answer_cut_at


class PermanentRecordError(RecordError):
    """The server rejected this record's request for good (e.g. a 400 about the request)."""

    failure_class = FailureClass.PERMANENT


class ContextLengthError(PermanentRecordError):
    """The server refused the request for its context length (HTTP 400 naming it): ``context_length``
    tokens, and the prompt's tokens when the message says (``prompt_at_least``: at least that many, as
    in "your prompt contains at least N input tokens"). Retried once when a smaller budget fits."""

    def __init__(
        self,
        message: str,
        *,
        context_length: int,
        prompt_tokens: int | None = None,
        prompt_at_least: bool = False,
    ) -> None:
        super().__init__(message)
        self.context_length = context_length
        self.prompt_tokens = prompt_tokens
        self.prompt_at_least = prompt_at_least


def summarize_validation_error(exc: ValidationError, limit: int = 8) -> str:
    """Field paths and messages only: pydantic's inputs would quote the output (and the record)."""
    lines = []
    for error in exc.errors(include_url=False, include_input=False)[:limit]:
        location = ".".join(str(part) for part in error["loc"]) or "(root)"
        lines.append(f"{location}: {error['msg']}")
    more = exc.error_count() - len(lines)
    return "; ".join(lines) + (f"; and {more} more" if more > 0 else "")


def first_error(group: BaseExceptionGroup[T]) -> T:
    """The first error of a (nested) exception group: the one the run reports."""
    error: T | BaseExceptionGroup[T] = group.exceptions[0]
    return first_error(error) if isinstance(error, BaseExceptionGroup) else error


def exit_code_for(ending: Ending | FatalRunError, *, reading: bool = False) -> int:
    """The exit code of a run (or a command) that ``ending`` ended: the fatal error that stopped it, or
    how it ended without one. A command ``reading`` the job's database that finds a run holding it is
    aborted (3), not "already running" (4): it is not a run."""
    if isinstance(ending, Ending):
        return _ENDING_CODES[ending]
    return _error_code(ending, reading=reading)


def _error_code(error: FatalRunError, *, reading: bool) -> int:
    if isinstance(error, ConfigError):
        return EXIT_CONFIG
    if isinstance(error, DatabaseError) and error.kind is DatabaseFailure.OUT_OF_MEMORY:
        return EXIT_CONFIG  # the job's duckdb_memory_limit is too small for what it asks
    if isinstance(error, AlreadyRunningError) and not reading:
        return EXIT_ALREADY_RUNNING
    if isinstance(error, StalledRunError):
        return EXIT_STALLED
    return EXIT_ABORTED
