"""The defaults and choices the commands' options show: the names they list, and that each is one the
code behind it takes."""

from __future__ import annotations

from pathlib import Path

from pipeline.defaults import FORMAT_BY_EXTENSION, ExportFormat, class_names
from pipeline.errors import PERMANENT_FAILURE_CLASSES, FailureClass
from pipeline.reports.export import export_format


def test_class_names_are_in_the_order_the_classes_are_defined_whatever_the_order_given() -> None:
    given = [FailureClass.PERMANENT, FailureClass.TRANSIENT, FailureClass.INVALID_JSON]
    assert class_names(given) == ["invalid_json", "transient", "permanent"]


def test_the_classes_a_retry_takes_are_every_class_but_transient() -> None:
    names = class_names(PERMANENT_FAILURE_CLASSES)
    assert names == [name for name in class_names() if name != "transient"]
    assert names[:2] == ["invalid_json", "schema_invalid"]  # the order --help lists them in


def test_every_export_format_has_an_extension_that_means_it() -> None:
    assert set(FORMAT_BY_EXTENSION.values()) == set(ExportFormat)
    for extension, fmt in FORMAT_BY_EXTENSION.items():
        assert export_format(Path(f"out{extension.upper()}"), None) is fmt
