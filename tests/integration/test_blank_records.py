"""Records with nothing to extract from (every prompt field empty), end to end against a real
`pipeline sim`: ``load`` names them, ``check`` says them, ``run`` sends none of them (the simulator's
own request count says so), and ``status``, its JSON, ``report --json``, the runs row and the Prometheus
textfile say the same count; once a newer export gives one text, the next run sends it.

Before, the blank rows were sent, and each came back with an extraction the model made up from the
system prompt alone."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
import pytest

from tests.support.jobs import table_rows, write_job
from tests.support.processes import pipeline_command, run_pipeline, sim_server, subprocess_env
from tests.support.run_numbers import prometheus, sim_requests, stored

pytestmark = pytest.mark.integration

TICKETS = (
    "id,subject,body\n"
    '1,Cannot log in,"The app refuses my password."\n'
    "2,,\n"
    '3,"  ",""\n'
    '4,Invoice twice,"I was charged twice in March."\n'
    '5,,"\t "\n'
    '6,,"Only a body, no subject: sent as before."\n'
    '7,Export question,"How do I export my reports?"\n'
)
BLANK = "3 records have empty subject and body: ids 2, 3, 5; they will not be sent"


def tickets_job(folder: Path, url: str) -> Path:
    return write_job(
        folder,
        source={"table": "tickets", "fields": ["subject", "body"]},
        prompt={"system": "You sort support tickets.", "user": "Subject: {subject}\n\n{body}"},
        endpoint={"base_url": url},
    )


def run(job: Path, textfile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        pipeline_command("run", str(job), "--log-format", "json", "--metrics-textfile", str(textfile)),
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_blank_records_are_said_never_sent_and_counted_alike_until_they_have_text(tmp_path: Path) -> None:
    data, database = tmp_path / "tickets.csv", tmp_path / "test.duckdb"
    data.write_text(TICKETS)
    with sim_server("--model", "test-model", "--seed", "1", "--latency", "0.01") as url:
        job = tickets_job(tmp_path, url)
        loaded = run_pipeline("load", str(data), "--job", str(job))
        assert loaded.returncode == 0, loaded.stderr
        assert f"blank:    {BLANK}" in loaded.stdout.splitlines()
        checked = orjson.loads(run_pipeline("check", str(job), "--json").stdout)
        blank_check = [check for check in checked["checks"] if check["name"] == "blank"]
        assert blank_check == [{"name": "blank", "status": "warn", "message": BLANK}]
        before = sim_requests(url)
        done = run(job, tmp_path / "run.prom")
        assert done.returncode == 0, done.stderr[-2000:]
        assert sim_requests(url) - before == 4  # 1, 4, 6 and 7: never 2, 3 or 5
        assert "blank:    3 records have empty subject and body: ids 2, 3, 5; not sent" in done.stdout

        status, numbers = stored(database)
        assert (status, numbers.done, numbers.failed, numbers.blank) == ("completed", 4, 0, 3)
        assert prometheus(tmp_path / "run.prom")["pipeline_records_blank"] == 3
        text = run_pipeline("status", str(job)).stdout
        assert "blank:    3 (empty subject and body: ids 2, 3, 5; not sent)" in text.splitlines(), text
        said = orjson.loads(run_pipeline("status", str(job), "--json").stdout)
        assert (said["blank"], said["blank_ids"], said["last_run"]["blank"]) == (3, [2, 3, 5], 3)
        assert said["done"] + sum(said["failed"].values()) + said["pending"] + said["blank"] == 7
        report = orjson.loads(run_pipeline("report", str(job), "--json").stdout)
        assert report["runs"][-1]["numbers"]["blank"] == 3
        assert table_rows(database, "SELECT count(*) FROM results WHERE record_id IN (2, 3, 5)") == [(0,)]

        data.write_text('id,subject,body\n3,Refund,"Where is my refund?"\n')  # a newer export
        reloaded = run_pipeline("load", str(data), "--job", str(job))
        assert "1 updated" in reloaded.stdout and "blank:" not in reloaded.stdout
        again = orjson.loads(run_pipeline("status", str(job), "--json").stdout)
        assert (again["pending"], again["blank"], again["blank_ids"]) == (1, 2, [2, 5])
        before = sim_requests(url)
        assert run(job, tmp_path / "again.prom").returncode == 0
        assert sim_requests(url) - before == 1
    _, numbers = stored(database)
    assert (numbers.done, numbers.blank) == (1, 2)
    assert table_rows(database, "SELECT count(*) FROM results") == [(5,)]
