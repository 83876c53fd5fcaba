"""Which variants a job has (main, declared, stored), the readers' check of --variant against them, and
the options a variant's last run was given."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.reports.variants import check_variant, known_variants, last_run_options, made_with
from pipeline.store.opening import open_for_reading, prepare_database
from tests.support.cli import cli_run, error_line
from tests.support.fakes import ScriptedServer, good_completion, respond
from tests.support.jobs import make_job
from tests.support.runs import run_served

pytestmark = pytest.mark.anyio

DECLARED = {"variants": {"short": {"max_tokens": 64}}}


async def test_main_the_declared_and_the_stored_variants_are_known_and_no_other(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=2, **DECLARED)
    assert made_with(spec, "quick") == ()  # no database written yet
    await run_served(spec.for_variant("quick"), ScriptedServer([respond(good_completion())]))
    connection = open_for_reading(spec)
    try:
        assert known_variants(connection, spec) == ["main", "short", "quick"]
        for name in ("main", "short", "quick"):
            check_variant(connection, spec.for_variant(name))
        with pytest.raises(ConfigError) as raised:
            check_variant(connection, spec.for_variant("quik"))
    finally:
        connection.close()
    assert str(raised.value) == (
        f"--variant 'quik': {spec.source_file} declares no such variant and {spec.database} holds nothing "
        "of it; known variants: main, short, quick"
    )


async def test_the_options_are_the_last_runs_and_none_in_an_older_database(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=2).for_variant("v2")
    for words, limit in ((("--model", "test-model"), 1), (("--model", "test-model", "--local"), 1)):
        await run_served(
            spec, ScriptedServer([respond(good_completion())]), variant_options=words, limit=limit
        )
    assert made_with(spec, "v2") == ("--model", "test-model", "--local") and made_with(spec, "v3") == ()
    connection = prepare_database(spec)
    try:
        connection.execute("ALTER TABLE runs DROP COLUMN options")  # as a database of an older version
        assert last_run_options(connection, spec, "v2") == ()
    finally:
        connection.close()


async def test_every_reader_names_the_known_variants_for_one_that_is_not(tmp_path: Path) -> None:
    """Before, `--variant nosuch` read as an empty variant: exit 0, an empty export; report said the
    variant had no run yet, as of a variant that might."""
    spec = make_job(tmp_path, records=2)
    await run_served(spec, ScriptedServer([respond(good_completion())]))
    job = str(spec.source_file)
    out, page = tmp_path / "out.jsonl", tmp_path / "runs.html"
    for command in (
        ["status", job],
        ["export", job, "--out", str(out)],
        ["failures", job],
        ["report", job],
        ["report", job, "--html", str(page)],
    ):
        result = cli_run(*command, "--variant", "nosuch")
        assert result.exit_code == 2, (command, result.output)
        assert error_line(result).endswith("holds nothing of it; known variants: main"), command
    assert not out.exists() and not page.exists()
    assert cli_run("export", job, "--out", str(out)).exit_code == 0 and out.exists()
