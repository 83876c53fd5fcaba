from __future__ import annotations

from pathlib import Path

from pipeline.bench.datasets import main
from tests.support.jobs import table_rows


def test_ads_are_repeated_under_new_ids(tmp_path: Path) -> None:
    ads = tmp_path / "ads.csv"
    ads.write_text('Title,FullDescription,Other\nNurse,"Care, nights",x\nChef,Cook,y\n')
    database = tmp_path / "source.duckdb"
    main([str(database), "5", "--ads", str(ads)])
    assert table_rows(database, "SELECT id, title FROM postings ORDER BY id") == [
        (0, "Nurse"),
        (1, "Chef"),
        (2, "Nurse"),
        (3, "Chef"),
        (4, "Nurse"),
    ]


def test_without_ads_the_postings_are_synthetic(tmp_path: Path) -> None:
    database = tmp_path / "source.duckdb"
    main([str(database), "3"])
    rows = table_rows(database, "SELECT id, title, length(description) FROM postings ORDER BY id")
    assert rows == [(0, "Engineer 0", 1440), (1, "Engineer 1", 1440), (2, "Engineer 2", 1440)]
