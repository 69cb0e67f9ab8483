"""benchmarks/batch_exactness.py's accounting: where a row parts from its reference, the two
runs' logprob gaps there, and whether every parting is a near tie."""

from __future__ import annotations

from benchmarks.batch_exactness import TIE, _summary, compare


def tops(*rows):
    return [list(r) for r in rows]


def test_equal_rows_are_equal() -> None:
    got = compare([5, 6, 7], tops([(5, -0.1)]), [5, 6, 7], tops([(5, -0.1)]), 0, "standard")
    assert got == {"prompt": 0, "mode": "standard", "equal": True}


def test_a_parting_gives_its_position_and_both_gaps() -> None:
    ref_top = tops([(5, -0.1), (9, -3.0)], [(6, -0.50), (8, -0.5004)])
    got_top = tops([(5, -0.1), (9, -3.0)], [(8, -0.50), (6, -0.5003)])
    got = compare([5, 6, 1], ref_top, [5, 8, 2], got_top, 3, "speculative")
    assert got["parted_at"] == 1 and got["tokens"] == [6, 8]
    assert abs(got["gap_alone"] - 0.0004) < 1e-9 and abs(got["gap_here"] - 0.0003) < 1e-9
    summary = _summary([got, {"equal": True}])
    assert summary["identical"] == 1 and summary["every_parting_a_near_tie"]


def test_a_parting_far_from_a_tie_or_without_both_tokens_is_flagged() -> None:
    far = compare([6], tops([(6, -0.1), (8, -2.0)]), [8], tops([(8, -0.1), (6, -2.0)]), 0, "x")
    assert far["gap_alone"] > TIE
    unknown = compare([6], tops([(6, -0.1), (7, -2.0)]), [8], tops([(8, -0.1)]), 1, "x")
    assert unknown["gap_alone"] is None and unknown["gap_here"] is None
    for row in (far, unknown):
        assert not _summary([row])["every_parting_a_near_tie"]


def test_a_shorter_run_parts_where_it_ends() -> None:
    got = compare([5, 6, 7], tops([], [], []), [5, 6], tops([], []), 0, "standard")
    assert not got["equal"] and got["parted_at"] == 2 and "tokens" not in got
