from __future__ import annotations

from pipeline.reports.runs_report import sparkline


def test_a_sparkline_draws_lowest_to_highest_with_gaps_for_missing_values() -> None:
    assert sparkline([0.0, 0.5, None, 1.0], share=True) == "▁▅ █"
    assert sparkline([100.0, 200.0, 150.0]) == "▁█▅"
    assert sparkline([None, None]) == ""
    assert sparkline([3.0, 3.0, 3.0]) == "▁▁▁"


def test_changes_below_the_drift_floor_are_drawn_flat() -> None:
    """0.000 against 0.003 is no trend for a share, nor 300.1 against 300.4 tokens for an amount."""
    assert sparkline([0.0, 0.0, 0.003, 0.0], share=True) == "▁▁▁▁"
    assert sparkline([300.1, 300.4, 300.2]) == "▁▁▁"
    assert sparkline([1.0, 1.0, 0.0], share=True) == "██▁"  # a field emptied: the whole height
