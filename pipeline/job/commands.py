"""The commands the pipeline prints as hints (``retry them: …``, ``… --redo-stale redoes them``): built
here, once, so that each one runs when pasted into any shell and does what its line says.

* The program is named by its path: the ``pipeline`` script beside the interpreter running now (a
  shell without the virtualenv active has no ``pipeline`` on its PATH: exit 127), or this interpreter
  with ``-m pipeline`` where there is no such script (the package run from a checkout).
* The job is named as it was given, and so are ``--database``, ``--variant`` and ``--endpoint``:
  a hint after a trial on another database, a variant or another server reads or runs that one, not
  the job's own. Each is added only to the commands that take it.
* Every word is quoted for a POSIX shell (``shlex``): a path with spaces, quotes or ``$`` is pasted
  as it is.

Where the command line is not at hand (a reader's error, a run's log), :meth:`Asked.of` gives the
command a job spec was loaded by: its job file, ``--database`` when it was given, its variant.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from pipeline.job.variants import MAIN_VARIANT

Verb = Literal["run", "status", "failures", "export", "report", "compare", "check", "load", "judge", "eval"]

#: Which of the options a hint repeats each command takes.
_TAKES_VARIANT = frozenset({"run", "status", "failures", "export", "report", "judge", "eval"})
_TAKES_ENDPOINT = frozenset({"run", "check"})


def program() -> list[str]:
    """The words that start ``pipeline`` from any shell, whatever its PATH."""
    script = Path(sys.executable).parent / "pipeline"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "pipeline"]


def command(*words: str) -> str:
    """``pipeline WORDS``, the program by its path, quoted for a shell: a command that takes no job
    (``serve-local``), or one whose words are all given."""
    return shlex.join([*program(), *words])


class LoadedSpec(Protocol):
    """What :meth:`Asked.of` reads of a job spec (:class:`pipeline.job.spec.JobSpec`: importing it
    here would make a circle, as the spec's own errors name commands built here)."""

    @property
    def source_file(self) -> Path: ...
    @property
    def database(self) -> Path: ...
    @property
    def variant(self) -> str: ...
    @property
    def overridden(self) -> frozenset[str]: ...


@dataclass(frozen=True, slots=True)
class Asked:
    """A command as it was given: what a hint after it names again."""

    job: Path
    database: Path | None = None
    variant: str | None = None
    endpoints: tuple[str, ...] = ()

    @classmethod
    def of(cls, spec: LoadedSpec, *, endpoints: Sequence[str] = ()) -> Asked:
        """The command ``spec`` was loaded by: its job file as given, ``--database`` if one was given
        (a spec without it reads the job's own), its variant unless main; ``endpoints``: as given."""
        database = spec.database if "database" in spec.overridden else None
        variant = None if spec.variant == MAIN_VARIANT else spec.variant
        return cls(spec.source_file, database, variant, tuple(endpoints))

    def of_variant(self, name: str) -> Asked:
        """The same command on variant ``name`` (main: none given)."""
        return dataclasses.replace(self, variant=None if name == MAIN_VARIANT else name)

    def command(self, verb: Verb, *options: str) -> str:
        """``pipeline VERB JOB OPTIONS`` with the database, variant and endpoints as given (those the
        verb takes), quoted for a shell."""
        words = [verb, *self._job_words(verb), *options]
        if self.database is not None:
            words += ["--database", str(self.database)]
        if self.variant is not None and verb in _TAKES_VARIANT:
            words += ["--variant", self.variant]
        if verb in _TAKES_ENDPOINT:
            for url in self.endpoints:
                words += ["--endpoint", url]
        return command(*words)

    def _job_words(self, verb: Verb) -> list[str]:
        # `load` takes the file first and the job as an option; every other command the job first.
        return ["FILE", "--job", str(self.job)] if verb == "load" else [str(self.job)]
