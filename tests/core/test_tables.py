"""core.tables.format_table: the one table formatter, markdown and aligned text."""
import pytest

from neuroshard.core.tables import format_table


def test_markdown_aligns_by_separator_and_shows_any_cell_with_str():
    assert format_table(["a", "b"], [["x", 1.5], ["yy", None]]) == \
        ["| a | b |", "|---|---|", "| x | 1.5 |", "| yy | None |"]
    assert format_table(["a", "b"], [], align="lr") == ["| a | b |", "|---|---:|"]


def test_text_pads_columns_first_left_rest_right_without_trailing_blanks():
    assert format_table(["name", "ms"], [["ab", "1.0"], ["abcdef", "10.25"]], style="text") == \
        ["name       ms", "------  -----", "ab        1.0", "abcdef  10.25"]
    assert format_table(["n", "note"], [["1", "x"]], style="text", align="rl") == ["n  note", "-  ----", "1  x"]


@pytest.mark.parametrize("kw", [{"style": "html"}, {"align": "lc"}, {"align": "l"}])
def test_bad_arguments_are_refused(kw):
    with pytest.raises(ValueError):
        format_table(["a", "b"], [["1", "2"]], **kw)
    with pytest.raises(ValueError):
        format_table(["a", "b"], [["1"]])
