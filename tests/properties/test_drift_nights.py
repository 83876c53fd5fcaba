"""Drift judged over drawn sequences of nights: ``report --fail-on-drift`` fails only when a measure got
worse beyond its bound. Each night takes the next 50 of the real UK job ads (the same kind of input
every night) against a server whose faults Hypothesis draws; whatever came before, a night on a fixed
server, on the same server as the night before, on a server no worse in any fault, and a night with
nothing to do never fail it. And a server that turned bad after good nights does.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
import yaml
from hypothesis import HealthCheck, Phase, example, given, note, settings
from hypothesis import strategies as st

from pipeline.sim import Faults, SimConfig
from tests.support.datasets import ADZUNA
from tests.support.jobs import linkedin_job
from tests.support.nights import QUICK_RETRY, Said, pipeline
from tests.support.properties import log_sequence
from tests.support.threaded_sim import ThreadedSim

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(not ADZUNA.is_file(), reason="the shared job ads are not here"),
]

PER_NIGHT = 50
FAULTS = ("invalid_json", "schema_invalid", "server_error", "length")
#: A server's faults: each class rare or absent, and at most one of them often (the issue's server:
#: invalid JSON half the time, a 5xx one time in twenty), so that no night is a broken server.
SERVERS = st.builds(
    lambda rare, often, rate: {**rare, often: rate},
    st.fixed_dictionaries({name: st.sampled_from([0.0, 0.0, 0.05]) for name in FAULTS}),
    st.sampled_from(FAULTS),
    st.sampled_from([0.0, 0.13, 0.25, 0.5]),
)
PROFILES = {
    "ci": settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)),
    "soak": settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck)),
    "dev": settings(
        max_examples=1,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    ),
}
PROFILE = PROFILES[os.environ.get("HYPOTHESIS_PROFILE", "ci")]


@dataclass
class Nights:
    """A LinkedIn job on the real ads, on a simulator of gpt-oss-120b whose faults change by night."""

    folder: Path
    sim: ThreadedSim
    nights: int
    log: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        spec = linkedin_job(self.folder / "ads.duckdb")
        spec["endpoint"] = {"base_url": self.sim.url}
        spec["model"] = "openai/gpt-oss-120b"
        spec["retry"] = {**spec.get("retry", {}), **QUICK_RETRY}
        spec["source"]["query"] = f"SELECT * FROM postings ORDER BY id LIMIT {self.nights * PER_NIGHT}"
        del spec["source"]["table"], spec["source"]["seed_file"]
        self.job = self.folder / "job.yaml"
        self.job.write_text(yaml.safe_dump(spec))
        loaded = pipeline(
            "load", str(ADZUNA), "--job", str(self.job), "--table", "postings",
            "--rename", "FullDescription=description", "--rename", "LocationRaw=location",
        )  # fmt: skip
        assert loaded.code == 0, loaded

    def night(self, faults: dict[str, float]) -> Said:
        self.sim.reconfigure(faults=Faults(**faults))
        said = pipeline("run", str(self.job), "--limit", str(PER_NIGHT), "--concurrency", str(PER_NIGHT))
        self.log.append(f"night on {faults}: exit {said.code}: {said.out.splitlines()[:1]}")
        assert said.code in (0, 1), said
        return said

    def close(self) -> None:
        self.sim.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def drift(self) -> Said:
        said = pipeline("report", str(self.job), "--fail-on-drift")
        self.log.append(said.out[-3000:])
        return said


def nights_on(servers: list[dict[str, float]]) -> Nights:
    sim = ThreadedSim(SimConfig(model="openai/gpt-oss-120b", profile="gpt-oss-120b", speed=50, seed=3))
    return Nights(Path(tempfile.mkdtemp(prefix="drift-")), sim, len(servers) + 1)


ISSUE_SERVER = {"invalid_json": 0.5, "schema_invalid": 0.0, "server_error": 0.05, "length": 0.0}


#: Reply times and records/min: a loaded test machine slows a night as much as a server does, so a
#: night's speed is not the server's here and these are left out of what the property holds.
MACHINE_SPEED = ("records_per_min", "latency_p50", "latency_p90")


@PROFILE
# Found from outside: four nights on a server whose answers were half invalid, then a night on it
# fixed, failed drift ("tokens_prompt 5,332 -> 3,150 (down)"): prompt tokens per record counted re-asks.
@example(before=[ISSUE_SERVER] * 4, last="fixed", quiet=False)
# Found by the soak: a night's 500s left transient failures that later nights' --limit retried in the
# place of new records, so one record was still to do on the "quiet" night.
@example(
    before=[
        {"invalid_json": 0.05, "length": 0.0, "schema_invalid": 0.0, "server_error": 0.5},
        {"invalid_json": 0.25, "server_error": 0.0, "length": 0.0, "schema_invalid": 0.0},
        {"invalid_json": 0.0, "server_error": 0.0, "schema_invalid": 0.0, "length": 0.05},
        dict.fromkeys(FAULTS, 0.0),
    ],
    last="better",
    quiet=True,
)
@given(
    before=st.lists(SERVERS, min_size=3, max_size=5),
    last=st.sampled_from(["fixed", "better"]),
    quiet=st.booleans(),
)
def test_a_night_no_worse_than_before_never_fails_drift(
    before: list[dict[str, float]], last: str, quiet: bool
) -> None:
    """The last night's server is fixed, or fails each class no more often than the best night before
    did; then nothing but the machine's speed may fail --fail-on-drift (the same server as the night
    before is no such night: that night may have been worse than the ones before it)."""
    if last == "fixed":
        final = dict.fromkeys(FAULTS, 0.0)
    else:
        final = {name: min(server[name] for server in before) for name in FAULTS}
    nights = nights_on(before)
    try:
        for faults in before:
            nights.night(faults)
        nights.night(final)
        if quiet:  # a night with nothing to do, once a plain run took what the nights' limit left
            nights.sim.reconfigure(faults=Faults())
            if "nothing to do" not in (leftover := pipeline("run", str(nights.job))).out:
                # Retried transient failures took new records' places under --limit: a small run
                # (not judged) does them, and the night after it has nothing to do.
                assert leftover.code == 0, leftover
                assert "nothing to do" in pipeline("run", str(nights.job)).out
        judged = nights.drift()
        failing = [
            entry for entry in orjson.loads(pipeline("report", str(nights.job), "--json").out)["drift"]
            if entry["fails"] and entry["measure"] not in MACHINE_SPEED
        ]  # fmt: skip
    finally:
        nights.close()
        log_sequence("drift", len(nights.log))
    note("\n".join(nights.log))
    assert not failing, f"a night no worse than those before failed --fail-on-drift:\n{judged.out[-2000:]}"


def test_a_server_turned_bad_after_good_nights_fails_drift() -> None:
    good = dict.fromkeys(FAULTS, 0.0)
    nights = nights_on([good, good, good])
    try:
        for faults in (good, good, good):
            nights.night(faults)
        nights.night({**good, "invalid_json": 0.5, "server_error": 0.25})
        judged = nights.drift()
    finally:
        nights.close()
    assert judged.code == 1, "\n".join(nights.log)
