"""The knee search's judgement of a level (:mod:`pipeline.servers.knee_search`): alone on this job's
throughput, beside other jobs on the server's at the server's level, the curve they all share."""

from __future__ import annotations

from pipeline.servers.knee_search import KneeSearch, pays
from pipeline.servers.window import DEFAULT_TUNING


def searched_from(level: int, throughput: float, others: float = 0.0) -> KneeSearch:
    search = KneeSearch.at_fit(level, DEFAULT_TUNING)
    search.measured_best(throughput, 0.01, DEFAULT_TUNING, others)
    return search


def test_beside_others_a_step_down_that_keeps_the_servers_throughput_pays() -> None:
    """Two jobs at 240 each past a server's best level: one steps to 230 and the server delivers as much.
    Its own throughput fell ~4%, which alone would bound the knee; for the server it is a plateau."""
    search = searched_from(240, 6000.0, others=240)
    words = search.judge(230, 6010.0, 0.01, DEFAULT_TUNING, others=240)
    assert search.best == 230 and search.hi == 240 and "plateau" not in words
    alone = searched_from(240, 3000.0)
    alone.judge(230, 3000.0 * 230 / 240, 0.01, DEFAULT_TUNING)
    assert alone.best == 240 and alone.lo == 230


def test_beside_others_a_step_up_must_pay_at_the_servers_level() -> None:
    """+4% of this job's 100 beside 300 others is +1% of the server's: it must return what +1% does."""
    search = searched_from(100, 8000.0, others=300)
    search.judge(104, 8000.0 * 1.004, 0.01, DEFAULT_TUNING, others=300)  # 0.4 elasticity, under noise
    assert search.best == 100 and search.hi == 104
    climbing = searched_from(100, 8000.0, others=300)
    climbing.judge(104, 8000.0 * 1.03, 0.01, DEFAULT_TUNING, others=300)
    assert climbing.best == 104


def test_levels_that_are_one_pay_only_by_a_gain() -> None:
    """This job stepped up as much as the others stepped down: the server's level did not move."""
    assert not pays(400, 6000.0, 400.5, 6050.0, DEFAULT_TUNING)
    assert pays(400, 6000.0, 400.5, 6200.0, DEFAULT_TUNING)
    search = searched_from(200, 6000.0, others=200)
    search.judge(210, 6000.0, 0.01, DEFAULT_TUNING, others=190)  # no ZeroDivisionError
    assert search.best == 200
