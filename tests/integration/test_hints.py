"""Every command the pipeline prints as a hint, pasted into bash as a person pastes it: no virtualenv on
the PATH (a bare `pipeline` would be exit 127), a folder a shell must quote, a trial on another database
and a variant, against a simulator the job's own endpoint does not name. Each runs, and does what its
line says: retrying failures takes no new record, a redo redoes, a re-run repeats the variant."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import orjson
import pytest
import yaml

from tests.support.jobs import job_dict, make_source, table_rows
from tests.support.processes import REPO, run_pipeline, sim_server

pytestmark = pytest.mark.integration

#: A shell without the virtualenv: only the system's programs (the job's test schema is imported from
#: the repository, as the jobs of these tests always are).
BARE_SHELL = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": "/nonexistent"}


def pasted(command: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """``command`` pasted into bash in ``folder``."""
    return subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=300, cwd=folder, env=BARE_SHELL
    )


def hint(output: str, label: str) -> list[str]:
    """The commands (between backquotes) of the line that starts with ``label``."""
    (line,) = [line for line in output.splitlines() if line.startswith(label)]
    return re.findall(r"`([^`]+)`", line)


def attempted(database: Path) -> set[int]:
    """The records variant quick has a result or a failure for."""
    sql = "SELECT record_id FROM results WHERE variant = 'quick' UNION SELECT record_id FROM failures"
    return {int(record) for (record,) in table_rows(database, f"{sql} WHERE variant = 'quick'")}


def write(folder: Path, **overrides: object) -> Path:
    path = folder / "job's file.yaml"
    path.write_text(yaml.safe_dump(job_dict(**overrides)))
    return path


def test_the_hints_of_a_trial_run_status_and_failures_run_as_pasted_and_do_what_they_say(
    tmp_path: Path,
) -> None:
    folder = tmp_path / 'a "trial" $HOME'
    folder.mkdir()
    job = write(folder, endpoint={"base_url": "http://127.0.0.1:9/v1"}, retry={"reasks": 0})
    trial = folder / "trial db.duckdb"
    make_source(trial, 60)
    given = ["--variant", "quick", "--database", str(trial)]
    with sim_server("--model", "test-model", "--fault-invalid-json", "0.5", "--seed", "7") as url:
        first = run_pipeline("run", str(job), "--endpoint", url, *given, "--sample", "20")
        assert first.returncode == 1, first.stdout + first.stderr
        failures_command, retry_command = hint(first.stdout, "failures:")
        tried = attempted(trial)
        failed = len(table_rows(trial, "SELECT 1 FROM failures WHERE variant = 'quick'"))
        assert len(tried) == 20 and failed > 0

        shown = pasted(failures_command, folder)
        assert shown.returncode == 0 and f"{failed} failure" in shown.stdout, shown.stderr
        (retry_line,) = [line for line in shown.stdout.splitlines() if line.startswith("retry them")]
        assert retry_line.split(": ", 1)[1] == retry_command.replace(f" --endpoint {url}", "")

        retried = pasted(retry_command, folder)  # --only-failed, on the trial, the variant, the server
        assert retried.returncode in (0, 1), retried.stdout + retried.stderr
        assert attempted(trial) == tried  # not one new record of the 40 pending
        assert table_rows(trial, "SELECT pending_at_start FROM runs ORDER BY run_id DESC LIMIT 1") == [
            (failed,)
        ]

    with sim_server("--model", "test-model") as url:  # the job's own server now, and the prompt edited
        write(folder, endpoint={"base_url": url}, prompt={"system": "Extract it well."})
        status = run_pipeline("status", str(job), *given)
        (redo_command,) = hint(status.stdout, "stale:")
        assert redo_command.endswith(f"--database '{trial}' --variant quick")
        assert "redoes them and takes the 40 pending too)" in status.stdout  # a run: the 40 never tried
        redone = pasted(redo_command, folder)
        assert redone.returncode == 0, redone.stdout + redone.stderr
        after = orjson.loads(run_pipeline("status", str(job), *given, "--json").stdout)
        assert after["stale"]["total"] == 0 and after["done"] == 60


def test_a_variant_made_with_a_prompt_file_is_judged_rerun_and_compared_with_it(tmp_path: Path) -> None:
    """After a --prompt-file variant v2: its status calls nothing stale, its re-run repeats it (before:
    "nothing to do"), and compare's noise-floor commands, pasted, measure it."""
    job = write(tmp_path, endpoint={"base_url": "http://127.0.0.1:9/v1"})
    database = tmp_path / "test.duckdb"
    make_source(database, 12)
    prompt = tmp_path / "v2 prompt.yaml"
    prompt.write_text("system: Extract the posting, carefully.\n")
    with sim_server("--model", "test-model") as url:
        for variant in (["--variant", "v2", "--prompt-file", str(prompt)], []):
            made = run_pipeline("run", str(job), "--endpoint", url, *variant)
            assert made.returncode == 0, made.stdout + made.stderr
        status = run_pipeline("status", str(job), "--variant", "v2")
        assert status.returncode == 0 and "stale" not in status.stdout and "done:     12" in status.stdout
        assert "note: variant v2 is judged with the options it was made with" in status.stderr
        compared = run_pipeline("compare", str(job), "--variants", "v2,main")
        assert compared.returncode == 0, compared.stderr
        rerun_command, compare_command = hint(compared.stdout, "noise floor:")
        rerun = pasted(rerun_command, tmp_path)  # with v2's options, on its server, as compare kept them
        assert rerun.returncode == 0 and "12 done, 0 failed of 12" in rerun.stdout, (
            rerun.stdout + rerun.stderr
        )
        again = pasted(compare_command, tmp_path)
        assert again.returncode == 0 and "noise floor: v2 against its re-run v2~rerun" in again.stdout


def test_a_readers_error_before_any_run_names_the_run_that_makes_the_database_as_pasted(
    tmp_path: Path,
) -> None:
    """The errors of a reader on a trial not run yet named a bare `pipeline run` (exit 127 without the
    virtualenv) and the job's own database: pasted, the run they name makes the trial's, for the
    variant asked; and a variant that is not one is named as none, with the known ones."""
    folder = tmp_path / "it's a trial"
    folder.mkdir()
    seed = folder / "records.jsonl"
    seed.write_text(
        "".join(
            orjson.dumps({"id": i, "title": f"T {i}", "description": "d"}).decode() + "\n" for i in range(12)
        )
    )
    trial = folder / "trial db.duckdb"
    with sim_server("--model", "test-model") as url:
        job = write(folder, endpoint={"base_url": url}, source={"seed_file": seed.name})
        given = ["--database", str(trial), "--variant", "quick"]
        status = run_pipeline("status", str(job), *given)
        assert status.returncode == 2 and not trial.exists(), status.stderr
        load_command, run_command = re.findall(r"`([^`]+)`", status.stderr)
        assert load_command.endswith(f"--job {shlex.quote(str(job))} --database {shlex.quote(str(trial))}")
        made = pasted(run_command, folder)
        assert made.returncode == 0 and "12 done, 0 failed of 12" in made.stdout, made.stdout + made.stderr
        assert table_rows(trial, "SELECT variant, count(*) FROM results GROUP BY 1") == [("quick", 12)]
    no_such = run_pipeline("report", str(job), "--database", str(trial), "--variant", "nosuch")
    assert no_such.returncode == 2 and no_such.stderr.rstrip().endswith("known variants: main, quick")
    assert run_pipeline("report", str(job), *given).returncode == 0
