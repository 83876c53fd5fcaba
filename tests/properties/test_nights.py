"""Whole nights of a job, drawn at random: a Hypothesis state machine drives the ``pipeline`` command over
a project (loads, runs with every selection, edits of the prompt and the schema, the commands the
pipeline prints, the readers) while the server under it changes (faults of each class at 0-100%, a
4,096 context with and without ``/tokenize``, gone and back, a second one). After every step it checks
what must always hold; a failure prints the shortest sequence of steps that breaks it.

The server is the simulator, served from a thread of this process on a real socket (every request is
HTTP); the database is a real DuckDB file, fresh for every sequence. ``HYPOTHESIS_PROFILE=soak`` (``make
soak``) draws more and longer sequences from a random seed; CI runs the ``ci`` profile from a fixed one.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, Phase, note, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from pipeline.errors import EXIT_INTERRUPTED
from pipeline.extraction.calibration import fewest_answer_tokens
from pipeline.job.spec import load_job
from pipeline.reports.status import job_status
from pipeline.sim import Faults, SimConfig
from tests.support.drawn_jobs import FORMATS, KINDS, DrawnSchema, FieldKind, Row, long_text, schemas, texts
from tests.support.night_model import Asked, Made, blank, fitting, selected
from tests.support.nights import (
    Project,
    RecordState,
    Said,
    duplicates,
    killed_midway,
    made_results,
    parquet_types,
    pipeline,
    printed_commands,
    record_states,
    run_rows,
)
from tests.support.properties import log_sequence
from tests.support.run_numbers import assert_said_alike
from tests.support.threaded_sim import SeenRequest, ThreadedSim

# The ci profile takes about five minutes; shrinking a failure may take as long again.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

settings.register_profile(
    "ci",
    max_examples=12,
    stateful_step_count=12,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# A look while writing a rule: few short sequences, no shrinking.
settings.register_profile(
    "dev",
    max_examples=4,
    stateful_step_count=10,
    deadline=None,
    phases=[Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "soak",
    max_examples=15,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

#: Fault classes the simulator draws per request. A hang costs the client's whole timeout, so it is
#: the soak's alone.
ANSWER_FAULTS = ("invalid_json", "schema_invalid", "length")
SERVER_FAULTS = ("server_error", "reset")
RATES = (0.0, 0.13, 0.25, 1.0)
#: Records a run must judge before the answer breaker may stop it (docs/running.md).
BREAKER_WINDOW = 32
#: Records in a row failed on the server side that stop a run (retry.abort_after_consecutive_failures).
ABORT_AFTER = 50


def say(text: str) -> None:
    """Hypothesis' note inside a drawn sequence; a sequence replayed step by step (test_nights_found.py)
    has no Hypothesis run around it and keeps nothing."""
    with contextlib.suppress(InvalidArgument):
        note(text)


class Nights(RuleBasedStateMachine):
    """One project, its server and what the tables held after the last step."""

    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="nights-"))
        self.sims: list[ThreadedSim] = []
        self.project: Project | None = None
        self.rows: dict[int, Row] = {}
        self.next_id = 1
        self.before: dict[int, RecordState] = {}
        self.made: set[tuple[int, int]] = set()
        self.made_from: dict[int, Made] = {}
        self.version = 0
        self.printed: list[tuple[str, ...]] = []
        self.steps = 0
        self.looks: list[str] = []

    # ---- the project

    @initialize(
        schema=schemas,
        concurrency=st.sampled_from([1, 2, 8, 64, 256]),
        first=st.lists(st.tuples(texts, texts), min_size=1, max_size=40),
        file_format=st.sampled_from(FORMATS),
    )
    def start(
        self, schema: DrawnSchema, concurrency: int, first: list[tuple[str, str]], file_format: str
    ) -> None:
        """A project with its first records loaded, on a server that works."""
        self.sims.append(ThreadedSim(SimConfig(model="sim-model", latency_s=0.002, seed=7)))
        self.project = Project(self.folder, [self.sims[0].url], schema, concurrency=concurrency)
        say(schema.source())
        self.load_rows([Row(self.take_id(), title, body) for title, body in first], file_format)

    def teardown(self) -> None:
        for sim in self.sims:
            sim.close()
        shutil.rmtree(self.folder, ignore_errors=True)
        log_sequence("nights", self.steps)

    @property
    def sim(self) -> ThreadedSim:
        return self.sims[0]

    def said(self, *args: str) -> Said:
        assert self.project is not None
        said = pipeline(*args)
        say(str(said))
        self.printed.extend(printed_commands(said.out + said.err))
        self.looks.extend(
            line.removeprefix("look:").strip() for line in said.out.splitlines() if line.startswith("look:")
        )
        self.check_said(said)
        return said

    @staticmethod
    def check_said(said: Said) -> None:
        """Every command ends with a known code; a configuration error is one line, no traceback."""
        assert "Traceback" not in said.out + said.err, said
        assert said.code in (0, 1, 2, 3, 4, 5), said
        if said.code == 2:
            assert len(said.error_lines) == 1, said
            assert said.error_lines[0].startswith("error: "), said

    # ---- loads

    @rule(
        new=st.lists(st.tuples(texts, texts), max_size=6),
        edits=st.lists(st.tuples(st.integers(0, 10_000), texts), max_size=3),
        empty=st.integers(0, 2),
        long=st.sampled_from([0, 0, 0, 3_000, 6_000]),
        file_format=st.sampled_from(FORMATS),
    )
    def load(
        self,
        new: list[tuple[str, str]],
        edits: list[tuple[int, str]],
        empty: int,
        long: int,
        file_format: str,
    ) -> None:
        assert self.project is not None
        rows = [Row(self.take_id(), title, body) for title, body in new]
        rows += [Row(self.take_id(), "", " ") for _ in range(empty)]
        if long:
            rows.append(Row(self.take_id(), "A long posting", long_text(long)))
        known = sorted(self.rows)
        for pick, body in edits if known else []:
            old = self.rows[known[pick % len(known)]]
            rows.append(Row(old.id, old.title, body))
        rows = list({row.id: row for row in rows}.values())  # one row an id, as an export has
        if not rows:  # nothing drawn: a step that does nothing
            return
        self.load_rows(rows, file_format)

    def load_rows(self, rows: list[Row], file_format: str) -> None:
        assert self.project is not None
        path = self.project.rows_file(rows, file_format)
        said = self.said("load", str(path), "--job", str(self.project.job))
        assert said.code == 0, said
        inserted = sum(row.id not in self.rows for row in rows)
        assert f"{inserted} new" in said.out, said
        self.rows.update({row.id: row for row in rows})

    def take_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    # ---- the server

    @rule(fault=st.sampled_from(ANSWER_FAULTS + SERVER_FAULTS), rate=st.sampled_from(RATES))
    def server_faults(self, fault: str, rate: float) -> None:
        for sim in self.sims:
            sim.reconfigure(faults=Faults(**{fault: rate}))

    @rule()
    def server_fixed(self) -> None:
        for sim in self.sims:
            sim.reconfigure(faults=Faults())

    @rule(context=st.sampled_from([4096, 131072]), tokenize=st.booleans())
    def server_context(self, context: int, tokenize: bool) -> None:
        for sim in self.sims:
            sim.reconfigure(max_model_len=context, tokenize=tokenize)

    @rule()
    def server_gone(self) -> None:
        self.sim.stop()

    @rule()
    def server_back(self) -> None:
        self.sim.start()

    @precondition(lambda self: len(self.sims) == 1)
    @rule()
    def second_endpoint(self) -> None:
        assert self.project is not None
        first = self.sim.server.config
        self.sims.append(ThreadedSim(SimConfig(model="sim-model", latency_s=0.002, seed=8)))
        self.sims[1].reconfigure(
            faults=first.faults, max_model_len=first.max_model_len, tokenize=first.tokenize
        )
        self.project.urls = [sim.url for sim in self.sims]
        self.project.write()

    # ---- the job

    @rule(words=texts)
    def edit_prompt(self, words: str) -> None:
        assert self.project is not None
        changed = f"{self.project.system} {words}".strip()
        if changed == self.project.system:
            return
        self.project.system = changed
        self.project.write()
        self.version += 1

    @rule(kind=st.sampled_from(KINDS))
    def edit_schema(self, kind: FieldKind) -> None:
        assert self.project is not None
        edited = self.project.schema.edited(kind)
        if edited == self.project.schema:
            return
        self.project.edit_schema(edited)
        self.version += 1
        say(self.project.schema.source())

    # ---- runs

    @rule(
        limit=st.none() | st.integers(1, 10),
        sample=st.none() | st.integers(1, 10),
        concurrency=st.none() | st.sampled_from([1, 3, 64, 256]),
    )
    def run(self, limit: int | None, sample: int | None, concurrency: int | None) -> None:
        assert self.project is not None
        args = ["run", str(self.project.job)]
        args += ["--limit", str(limit)] if limit else []
        args += ["--sample", str(sample)] if sample else []
        args += ["--concurrency", str(concurrency)] if concurrency else []
        self.night(*args)

    @rule(
        failure_class=st.none()
        | st.sampled_from(["invalid_json", "schema_invalid", "truncated", "too_long"]),
        how=st.sampled_from(["--only-failed", "--retry-failed", ""]),
    )
    def retry_failed(self, failure_class: str | None, how: str) -> None:
        """``--only-failed``, ``--retry-failed`` (with the backlog), or ``--class`` alone (the same)."""
        assert self.project is not None
        asked = (how,) if how else ()
        if not (how or failure_class):  # a plain run: the run rule's
            return
        self.night(
            "run", str(self.project.job), *asked, *(["--class", failure_class] if failure_class else [])
        )

    @rule()
    def redo_stale(self) -> None:
        assert self.project is not None
        self.night("run", str(self.project.job), "--redo-stale")

    @precondition(lambda self: bool(self.printed))
    @rule(pick=st.integers(0, 1000))
    def paste_a_printed_command(self, pick: int) -> None:
        words = self.printed[pick % len(self.printed)]
        if words and words[0] == "run":
            self.night(*words)
        else:
            self.said(*words)

    @rule()
    def variant_night(self) -> None:
        """A run of a variant (a smaller budget) writes its own results: the main ones stay as they were."""
        assert self.project is not None
        before = record_states(self.project.database)
        said = self.said("run", str(self.project.job), "--variant", "short")
        assert said.code in (0, 1, 3), said
        assert record_states(self.project.database) == before, "a variant's run changed the main results"

    @precondition(lambda self: self.sims[0].alive)
    @rule(mistake=st.sampled_from(["model", "endpoint"]))
    def misconfigured_night(self, mistake: str) -> None:
        """A nightly command with a wrong model or an endpoint without /v1 fails as a configuration
        error, whether or not there is work: a broken nightly job never looks like a quiet night."""
        assert self.project is not None
        wrong = (
            ("--model", "nosuch/model")
            if mistake == "model"
            else ("--endpoint", self.sim.url.removesuffix("/v1"))
        )
        before = record_states(self.project.database)
        runs = run_rows(self.project.database)
        said = self.said("run", str(self.project.job), *wrong)
        assert said.code == 2, f"a run with a wrong {mistake} ended {said.code}: {said}"
        assert record_states(self.project.database) == before
        assert run_rows(self.project.database) == runs, "a misconfigured run was recorded as a night"

    @precondition(lambda self: self.sims[0].alive)
    @rule(after=st.integers(0, 30), hard=st.booleans())
    def cancelled_run(self, after: int, hard: bool) -> None:
        """A nightly run killed midway: SIGTERM (it lets what is in flight finish) or SIGKILL (a crash)."""
        assert self.project is not None
        before = record_states(self.project.database)
        taken = selected(before, self.rows, self.made_from, self.version, Asked())
        sent = len(self.sim.seen)
        runs = len(run_rows(self.project.database))
        ended = killed_midway(
            ("run", str(self.project.job)),
            lambda: len(self.sim.seen) >= sent + after,
            signal.SIGKILL if hard else signal.SIGTERM,
        )
        say(f"killed after {after} requests ({'SIGKILL' if hard else 'SIGTERM'}): {ended}")
        after_states = record_states(self.project.database)
        changed = {record for record in after_states if after_states[record] != before.get(record)}
        assert changed <= taken, (
            f"a cancelled run changed records it was not asked for: {sorted(changed - taken)}"
        )
        assert "Traceback" not in ended.err, ended
        rows = run_rows(self.project.database)
        if not hard and ended.code == EXIT_INTERRUPTED:
            assert len(rows) == runs + 1 and rows[-1]["status"] == "interrupted", rows[-1:]
            made = len([r for r in changed if after_states[r].result_run == rows[-1]["run_id"]])
            assert made == rows[-1]["done"], f"{made} results of the run, its row says {rows[-1]['done']}"
        for record in changed:
            self.made_from[record] = Made(self.rows[record], self.version)

    @precondition(lambda self: self.sims[0].alive and len(self.sims) == 1)
    @rule()
    def check_then_run(self) -> None:
        """What ``check`` says of the longest pending prompt, the plain run after it does: a record it
        says a run refuses ends too_long unsent, one it fits is never too_long; a context the server
        does not count is never ``ok``."""
        assert self.project is not None
        said = self.said("check", str(self.project.job), "--json", "--probe-timeout", "20")
        if all(row.empty for row in self.rows.values()):
            assert said.code == 2 and "every record of the source is blank" in said.err, said
            return
        assert said.code in (0, 1, 3), said
        endpoint = orjson.loads(said.out)["endpoints"][0]
        context = {check["name"]: check for check in endpoint["checks"]}.get("context")
        longest = endpoint.get("longest_prompt")
        if context is not None and not self.sim.server.config.tokenize:
            assert context["status"] != "ok", f"check saw no count and said ok: {context}"
        sent = len(self.sim.seen)
        self.night("run", str(self.project.job))
        if not longest or longest["record_id"] not in self.rows:
            return
        row = self.rows[longest["record_id"]]
        state = record_states(self.project.database)[row.id]
        too_long = state.failure is not None and state.failure[0] == "too_long" and state.result_run is None
        if longest["max_tokens"] is None:
            assert too_long, f"check said a run refuses record {row.id}; the run made {state}"
            text = f"Title: {row.title}\n\n{row.body}"
            assert all(request.user != text for request in self.sim.seen[sent:]), "sent what check refused"
        else:
            assert not too_long, f"check said record {row.id} fits with {longest['max_tokens']}: {state}"

    def night(self, *args: str) -> Said:
        assert self.project is not None
        asked = Asked.of(args)
        before = record_states(self.project.database)
        taken = selected(before, self.rows, self.made_from, self.version, asked)
        seen_before = [len(sim.seen) for sim in self.sims]
        runs = len(run_rows(self.project.database))
        textfile = self.folder / "run.prom"
        textfile.unlink(missing_ok=True)
        said = self.said(*args, "--metrics-textfile", str(textfile), "--log-format", "json")
        after = record_states(self.project.database)
        if len(run_rows(self.project.database)) > runs and textfile.exists():
            variant = args[args.index("--variant") + 1] if "--variant" in args else "main"
            assert_said_alike(
                self.project.job, self.project.database, textfile, said, read=pipeline, variant=variant
            )
        changed = {record for record in after if after[record] != before.get(record)}
        say(f"selected {sorted(taken)}; changed {sorted(changed)}")
        assert changed <= taken, f"the run changed records it was not asked for: {sorted(changed - taken)}"
        if asked.limit is not None:
            assert len(changed) <= asked.limit, f"--limit {asked.limit} changed {len(changed)} records"
        seen = [
            request
            for sim, count in zip(self.sims, seen_before, strict=False)
            for request in sim.seen[count:]
        ]
        self.check_requests(seen)
        self.check_ending(said, asked, taken, after, seen)
        for record in changed:
            self.made_from[record] = Made(self.rows[record], self.version)
        self.check_status()
        return said

    def check_requests(self, seen: list[SeenRequest]) -> None:
        """No request below the budget floor; nothing that cannot fit the context, nothing blank."""
        assert self.project is not None
        context = self.sim.server.config.max_model_len
        floor = min(self.project.max_tokens, fewest_answer_tokens(self.project.schema_class()))
        for request in seen:
            assert request.max_tokens is not None and request.max_tokens >= floor, (floor, request)
            assert len(request.user) // 4 < context, f"sent a prompt of {len(request.user) // 4} tokens"
            assert request.user.removeprefix("Title:").strip(), f"sent a blank record: {request.user!r}"

    def check_ending(
        self,
        said: Said,
        asked: Asked,
        taken: set[int],
        after: dict[int, RecordState],
        seen: list[SeenRequest],
    ) -> None:
        """How the run ended, by what its server did."""
        config = self.sim.server.config
        worst = max(rate for _, rate in config.faults.items())
        alive = any(sim.alive for sim in self.sims)
        if said.code == 2:
            return
        if not alive:
            assert said.code == 3, f"a run with no server ended {said.code}: {said}"
            return
        if not taken:
            assert said.code == 0, f"a night with nothing to do ended {said.code}: {said}"
            return
        if worst <= 0.25:
            assert said.code in (0, 1), f"a server failing at most 25% stopped the run: {said}"
        if worst == 1.0 and asked.limit is None:
            self.check_broken_server(said, taken, seen, asked)
        if worst == 0.0 and asked.limit is None:
            context = config.max_model_len
            for record in taken:
                state, fits = after[record], fitting(self.rows[record], context)
                if fits is True:
                    assert state.result_run is not None, (
                        f"a fixed server left record {record} undone: {state}"
                    )
                elif fits is False:
                    assert state.failure and state.failure[0] == "too_long", f"record {record}: {state}"

    def check_broken_server(self, said: Said, taken: set[int], seen: list[SeenRequest], asked: Asked) -> None:
        """A server failing every request stops the run within the documented bound (docs/running.md):
        answers that never validate, once the first 32 records to finish failed (about 3 attempts x
        (32 + concurrency) requests); 5xx and resets once 50 records in a row failed on them, each after
        its transient retries (about 7 x (50 + concurrency) requests). A smaller run ends before either
        bound, its records failed, transient ones for a plain run to do again."""
        assert self.project is not None
        (fault,) = [name for name, rate in self.sim.server.config.faults.items() if rate == 1.0]
        in_flight = (asked.concurrency or self.project.concurrency) * sum(sim.alive for sim in self.sims)
        sendable = [
            record for record in taken if fitting(self.rows[record], self.sim.server.config.max_model_len)
        ]
        if fault in ANSWER_FAULTS and len(sendable) >= BREAKER_WINDOW + in_flight:
            assert said.code == 3, f"answers that never validate did not stop the run: {said}"
            bound = 3 * (BREAKER_WINDOW + in_flight)
            assert len(seen) <= bound, f"{len(seen)} requests before the stop, the docs say about {bound}"
        if fault in SERVER_FAULTS and len(sendable) >= ABORT_AFTER + in_flight:
            assert said.code == 3, f"a server failing every request did not stop the run: {said}"
            bound = 7 * (ABORT_AFTER + in_flight)
            assert len(seen) <= bound, f"{len(seen)} requests before the stop, the docs say about {bound}"

    # ---- readers

    @rule()
    def status(self) -> None:
        self.check_status()

    def check_status(self) -> None:
        """``status --json`` counts every record once, as the tables and the model say it."""
        assert self.project is not None
        said = self.said("status", str(self.project.job), "--json")
        assert said.code == 0, said
        status = orjson.loads(said.out)
        states = record_states(self.project.database)
        pending = selected(states, self.rows, self.made_from, self.version, Asked())
        blanks = blank(states, self.rows, self.made_from, self.version)
        kept = {record: state for record, state in states.items() if record not in pending | blanks}
        done = {record for record, state in kept.items() if state.result_run is not None}
        failed = Counter(
            state.failure[0] for state in kept.values() if state.result_run is None and state.failure
        )
        stale = {record for record in done if self.made_from[record].version < self.version}
        assert status["source_records"] == len(self.rows), status
        assert (status["done"], status["pending"]) == (len(done), len(pending)), (status, sorted(pending))
        assert status["failed"] == dict(failed), status
        assert status["blank"] == len(blanks), (status, sorted(blanks))
        assert status["stale"]["total"] == len(stale), (status["stale"], sorted(stale))
        api = job_status(load_job(self.project.job))  # the Python API the command is a call of
        assert (api.source_records, api.done, api.pending, api.failed, api.blank.count, api.stale) == (
            status["source_records"], status["done"], status["pending"], status["failed"], status["blank"],
            status["stale"],
        )  # fmt: skip

    @rule(file_format=st.sampled_from(["csv", "parquet", "jsonl"]))
    def export_flat(self, file_format: str) -> None:
        assert self.project is not None
        out = self.folder / f"export.{file_format}"
        out.unlink(missing_ok=True)
        said = self.said("export", str(self.project.job), "--out", str(out), "--flatten")
        if said.code != 0 or file_format != "parquet" or not out.exists():
            return
        types = parquet_types(out)
        for column, sql_type in self.project.schema.flat_types().items():
            assert types.get(column) == sql_type, f"export --flatten typed {column} {types.get(column)}"

    @precondition(lambda self: bool(self.looks))
    @rule()
    def look(self) -> None:
        """The ``look:`` line a run printed runs as pasted and shows the results."""
        shown = subprocess.run(shlex.split(self.looks[-1]), capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert "record_id" in shown.stdout, shown.stdout

    @rule()
    def report(self) -> None:
        assert self.project is not None
        self.said("report", str(self.project.job))

    @rule()
    def failures(self) -> None:
        assert self.project is not None
        self.said("failures", str(self.project.job))

    # ---- what always holds

    @invariant()
    def every_record_once_and_nothing_lost(self) -> None:
        self.steps += 1
        if self.project is None:
            return
        database = self.project.database
        assert not duplicates(database), duplicates(database)
        states = record_states(database)
        assert set(states) == set(self.rows), "the source lost or gained records"
        made = made_results(database)
        lost = self.made - made
        assert not lost, f"results lost: {sorted(lost)[:5]}"
        self.made = made
        self.before = states


Nights.TestCase.settings = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
test_nights = Nights.TestCase
