"""The one table formatter of neuroshard: result tables as markdown (reports, README tables) or aligned text
(what a script prints)."""
from __future__ import annotations

from typing import Sequence

STYLES = ("markdown", "text")


def format_table(header: Sequence[str], rows: Sequence[Sequence], style: str = "markdown",
                 align: str | None = None) -> list[str]:
    """The lines of a table of `rows` (cells already formatted; others shown with `str`) under `header`.

    `align`: one character per column, "l" (left) or "r" (right). markdown: "| a | b |" lines under a
    separator row, "---" for a left column and "---:" for a right one (default: "---" everywhere).
    text: columns padded to their widest cell and joined by two spaces (no trailing blanks), under a row of dashes (default: the
    first column left, the others right)."""
    if style not in STYLES:
        raise ValueError(f"style must be one of {', '.join(STYLES)}, got {style!r}")
    n = len(header)
    cells = [[str(c) for c in r] for r in rows]
    if any(len(r) != n for r in cells):
        raise ValueError(f"every row needs {n} cells, one per header")
    align = align or ("l" * n if style == "markdown" else "l" + "r" * (n - 1))
    if len(align) != n or set(align) - {"l", "r"}:
        raise ValueError(f"align needs one 'l' or 'r' per column ({n}), got {align!r}")
    if style == "markdown":
        line = lambda cs: "| " + " | ".join(cs) + " |"  # noqa: E731
        return [line(header), "|" + "".join("---:|" if a == "r" else "---|" for a in align), *map(line, cells)]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(header)]
    line = lambda cs: "  ".join(c.rjust(w) if a == "r" else c.ljust(w)  # noqa: E731
                                for c, w, a in zip(cs, widths, align)).rstrip()
    return [line(header), line(["-" * w for w in widths]), *map(line, cells)]
