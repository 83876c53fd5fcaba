"""What a caller asks of a run (:class:`RunOptions`) and what it gets back (:class:`RunSummary`), and
the command-line options that make a variant (:class:`VariantOptions`).

A variant made from options (``run --variant v2 --prompt-file p2.yaml``) is that variant only with
them: its runs keep them (``runs.options``), and a later run, re-run, redo or status of the variant
given none of ``--model``, ``--prompt-file`` and ``--local`` takes them again
(:func:`options_of_variant`), so its results are judged and redone with its own prompt, not the job's.
``main`` is the job file itself: options given to it are for that command only.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from pipeline.errors import (
    PERMANENT_FAILURE_CLASSES,
    ConfigError,
    DatabaseLockedError,
    Ending,
    FailureClass,
    exit_code_for,
)
from pipeline.job.commands import Asked
from pipeline.job.spec import MAIN_VARIANT, JobSpec
from pipeline.job.variants import prompt_file_changes, rerun_of
from pipeline.quality.drift import Drift
from pipeline.reports.variants import made_with
from pipeline.run.progress import ProgressReporter
from pipeline.source.blank import BlankRecords
from pipeline.source.lock import lock_holder
from pipeline.source.pending import Selection
from pipeline.source.versions import StaleCause
from pipeline.store.numbers import RunNumbers
from pipeline.store.run_profiles import NOTHING_TO_DO as QUIET

if TYPE_CHECKING:
    from pipeline.local import LocalServerOptions


class RunStatus(StrEnum):
    NOTHING_TO_DO = QUIET  # kept as a row of its own (store/run_profiles.py reads it as a quiet night)
    COMPLETED = "completed"
    COMPLETED_WITH_FAILURES = "completed_with_failures"
    INTERRUPTED = "interrupted"
    STALLED = "stalled"
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class RunOptions:
    limit: int | None = None
    retry_failed: bool = False
    # Only these classes (transient ones are retried anyway, except by only_failed with classes that
    # leave it out); empty: every class. Given without only_failed they are retried with the backlog,
    # as with retry_failed: a class named is never silently a plain run.
    retry_classes: frozenset[FailureClass] = frozenset()
    only_failed: bool = False  # retry failures and take nothing else
    redo_stale: frozenset[StaleCause] = frozenset()  # also redo results stale for these job causes
    sample: int | None = None  # only records of a fixed, seeded sample of the source
    seed: int = 0
    handle_signals: bool = False
    progress: ProgressReporter | None = None
    metrics_port: int | None = None
    metrics_textfile: Path | None = None
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep
    # With endpoint.base_url: local, how to start the bundled vLLM server (pipeline.local).
    local_server: LocalServerOptions | None = None
    # The command-line options that changed the job (--model M, --prompt-file F...), kept with the run
    # so that a hint can repeat them: a re-run of a variant made with them needs them again.
    variant_options: tuple[str, ...] = ()

    @property
    def retry(self) -> frozenset[FailureClass]:
        """The failure classes this run extracts again."""
        transient = frozenset({FailureClass.TRANSIENT})
        if self.only_failed:
            return self.retry_classes or frozenset(FailureClass)
        if self.retry_failed or self.retry_classes:
            return transient | (self.retry_classes or PERMANENT_FAILURE_CLASSES)
        return transient

    def capped(self, count: int) -> int:
        """``count`` records, at most ``limit`` of them."""
        return count if self.limit is None else min(count, self.limit)

    @property
    def selection(self) -> Selection:
        return Selection(
            retry=self.retry,
            only_failed=self.only_failed,
            redo=self.redo_stale,
            sample=self.sample,
            seed=self.seed,
            limit=self.limit,
        )


@dataclass(frozen=True, slots=True)
class RunSummary:
    run_id: int | None
    status: RunStatus
    database: Path
    results_table: str
    failures_table: str
    # The run's numbers as its row has them at its end (records/min, attempts, tokens...).
    numbers: RunNumbers = field(default_factory=RunNumbers)
    # Results left stale because the job changed since they were made: "total" and per cause (only
    # --redo-stale redoes them).
    stale_kept: Mapping[str, int] = field(default_factory=dict)
    variant: str = "main"
    # What moved in this run beyond its usual run-to-run variation (pipeline.quality.drift).
    drift: tuple[Drift, ...] = ()
    # The source's records, counted when nothing was pending (0: the source is empty, not all done).
    source_records: int | None = None
    # What it set aside unsent, every prompt field empty: how many (``numbers.blank``) and which.
    blank: BlankRecords | None = None

    @property
    def exit_code(self) -> int:
        """Of :func:`~pipeline.errors.exit_code_for`: a run stalled or aborted raised its error instead."""
        if self.status is RunStatus.INTERRUPTED:
            return exit_code_for(Ending.INTERRUPTED)
        failed = self.status is RunStatus.COMPLETED_WITH_FAILURES
        return exit_code_for(Ending.FAILURES if failed else Ending.DONE)

    @property
    def done(self) -> int:
        return self.numbers.done

    @property
    def failed(self) -> int:
        return self.numbers.failed

    @property
    def pending_at_start(self) -> int:
        return self.numbers.pending_at_start


@dataclass(frozen=True, slots=True)
class VariantOptions:
    """The command-line options that change what a run sends: where (``--endpoint``) and what it
    makes (``--model``, ``--prompt-file``, ``--local``). A run keeps them as :meth:`words`."""

    endpoint: str | None = None
    model: str | None = None
    prompt_file: Path | None = None
    local: bool = False
    kept: bool = False  # taken from the variant's last run, not given on this command line

    def words(self) -> tuple[str, ...]:
        """As given on a command line, the prompt file by its full path: what a run keeps and a hint
        repeats."""
        return (*(("--endpoint", self.endpoint) if self.endpoint else ()), *self.words_of_making())

    def words_of_making(self) -> tuple[str, ...]:
        """:meth:`words` but the endpoint."""
        return (
            *(("--model", self.model) if self.model is not None else ()),
            *(("--prompt-file", str(self.prompt_file.resolve())) if self.prompt_file else ()),
            *(("--local",) if self.local else ()),
        )

    def making(self) -> VariantOptions:
        """Only those that make the results (the endpoint is where they are made, not what)."""
        return dataclasses.replace(self, endpoint=None)

    @property
    def make_results(self) -> bool:
        return self.model is not None or self.prompt_file is not None or self.local

    @classmethod
    def of_words(cls, words: Sequence[str]) -> VariantOptions:
        """The options kept as :meth:`words`; a word this version does not know is passed over."""
        found: dict[str, str] = {}
        local = False
        for index, word in enumerate(words):
            if word == "--local":
                local = True
            elif word in _VALUED and index + 1 < len(words):
                found[_VALUED[word]] = words[index + 1]
        prompt = found.get("prompt_file")
        return cls(found.get("endpoint"), found.get("model"), Path(prompt) if prompt else None, local)

    def applied(self, spec: JobSpec) -> JobSpec:
        """``spec`` with ``--model`` and ``--prompt-file`` (``--local`` and ``--endpoint`` are the
        caller's: they choose the server). Kept options that no longer apply say where they came from."""
        try:
            prompt = prompt_file_changes(self.prompt_file) if self.prompt_file else None
            return spec.with_overrides(model=self.model, prompt=prompt)
        except ConfigError as error:
            if not self.kept:
                raise
            raise ConfigError(
                f"variant {spec.variant} was made with {shlex.join(self.words_of_making())} (kept with its "
                f"last run), which no longer applies: {error}; give --model or --prompt-file to run it "
                "with others"
            ) from error


_VALUED = {"--endpoint": "endpoint", "--model": "model", "--prompt-file": "prompt_file"}


@dataclass(frozen=True, slots=True)
class RunCommands:
    """The commands a run's own lines name (its log, its errors): its job, database, variant and endpoint
    as given, with the options that made the variant (:attr:`RunOptions.variant_options`)."""

    asked: Asked
    made: VariantOptions

    @classmethod
    def of(cls, spec: JobSpec, options: RunOptions) -> RunCommands:
        made = VariantOptions.of_words(options.variant_options)
        return cls(Asked.of(spec, endpoints=(made.endpoint,) if made.endpoint else ()), made)

    def run(self, *words: str) -> str:
        """``run`` with ``words`` and the options that made the variant."""
        return self.asked.command("run", *words, *self.made.words_of_making())

    def check(self) -> str:
        """``check`` of the run's servers with its model."""
        model = ("--model", self.made.model) if self.made.model is not None else ()
        return self.asked.command("check", *model)


def options_of_variant(spec: JobSpec, given: VariantOptions, *, for_run: bool = False) -> VariantOptions:
    """The options a command on ``spec``'s variant runs or judges it with: those ``given``; for a
    variant other than main given none that make results, those its last run was given (a re-run's:
    those of the variant it repeats), with the endpoint as given. Blocking (reads the database).

    ``for_run``: a run holding the database is not waited for (this run will say it is running)."""
    variant = rerun_of(spec.variant) or spec.variant
    if given.make_results or variant == MAIN_VARIANT or not spec.database.exists():
        return given
    if for_run and lock_holder(spec.database) is not None:
        return given
    try:
        words = made_with(spec, variant)
    except DatabaseLockedError:  # held by another process: the command says so when it opens it
        return given
    kept = VariantOptions.of_words(words)
    if not kept.make_results:
        return given
    return dataclasses.replace(kept, endpoint=given.endpoint, kept=True)
