"""CSV cells an auditor's spreadsheet reads as text: formula escaping (OWASP CSV injection)
and quoting of line breaks."""

from __future__ import annotations

import csv
import io

import pytest

from gateway.database.audit.queries import csv_cell, csv_line


@pytest.mark.parametrize(
    "value",
    ['=HYPERLINK("http://evil.example","x")', "+1+1", "-2+3", "@SUM(A1)", "\t=1", "\r=1"],
)
def test_text_a_spreadsheet_would_run_is_prefixed(value: str) -> None:
    assert csv_cell(value) == "'" + value
    (row,) = list(csv.reader(io.StringIO(csv_line(["a", value, "b"]), newline="")))
    assert row == ["a", "'" + value, "b"]


def test_data_stays_as_it_was() -> None:
    assert csv_line([1, -1.5, None, "tiny-target", "a=b", ["x"], {"k": 1}]) == (
        '1,-1.5,,tiny-target,a=b,"[""x""]","{""k"": 1}"\n'
    )


def test_a_carriage_return_inside_a_cell_does_not_split_the_row() -> None:
    line = csv_line(["a\rb", "c\nd", "e"])
    assert line.endswith('"\n') is False and line.endswith(",e\n")
    assert list(csv.reader(io.StringIO(line, newline=""))) == [["a\rb", "c\nd", "e"]]
