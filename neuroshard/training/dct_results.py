"""Statistics and results files of the DCT benchmarks (benchmarks/dct.py, dct_network.py, mp_aware_training.py).

`mean_ci`: mean of paired differences with a two-sided 95% Student-t interval (n - 1 degrees of
freedom); `ratio_ci`: the same on log ratios, reported as a geometric mean ratio and its interval;
`runs_done`: the runs a results CSV already holds, resumed only by a run with the same settings;
`read_results`: a results CSV, checked; `step_parts` and `median_cell`: one run's step split into its
parts and a column's median for a table, the same in every DCT benchmark. Their tables go through
`core.tables.format_table`.
"""
from __future__ import annotations

import numpy as np

from ..core.artifacts import check_output_file, check_results_csv, source_digest
from ..core.errors import UserError
from ..core.intervals import paired_interval


def mean_ci(values, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, lo, hi) of `values` with a Student-t interval (`core.intervals.paired_interval`); lo = hi = mean for one value."""
    return tuple(paired_interval(values, level=level, ratio=False))[:3]


def ratio_ci(ratios, level: float = 0.95) -> tuple[float, float, float]:
    """(geometric mean, lo, hi) of positive ratios, the interval taken on their logs."""
    return tuple(paired_interval(ratios, np.ones(len(ratios)), level=level))[:3]


STEP_PARTS = (("compute", "compute_ms"), ("DP codec", "dp_codec_ms"), ("MP codec", "mp_codec_ms"),
              ("MP comm", "mp_comm_ms"), ("DP comm", "dp_comm_ms"))  # a step's parts, which add up to step_ms


def step_parts(r, digits: int = 1) -> str:
    """'step S ms = compute C + DP codec D + MP codec M + MP comm A + DP comm B' of one run's result `r`."""
    return f"step {r['step_ms']:.{digits}f} ms = " + " + ".join(f"{name} {r[col]:.{digits}f}" for name, col in STEP_PARTS)


def median_cell(g, column: str, digits: int = 1) -> str:
    """The median of `column` over a group of runs, for a table; '-' where the rows predate the column (the
    codec columns: such rows' compute still includes the coding)."""
    if column not in g or g[column].isna().all():
        return "-"
    return f"{g[column].median():.{digits}f}"


def step_part_cells(g, digits: int = 1) -> dict:
    """Table cells of a group of runs' median step and its parts."""
    return {"step (ms)": median_cell(g, "step_ms", digits),
            **{name: median_cell(g, col, digits) for name, col in STEP_PARTS}}


def runs_done(csv, fresh: bool, settings: dict, keys: tuple[str, ...]) -> set[tuple]:
    """The runs `csv` already holds, as tuples of its `keys` columns (none with `fresh`, which deletes it).
    Refused unless every row was made with `settings` (column -> value) and by the same neuroshard code
    (the rows' `code` column, the source digest), so one table never mixes runs of different settings or
    of code before and after a change."""
    check_output_file(csv, "--out_dir:")  # a folder there would fail the run's first write, after its work
    if fresh:
        csv.unlink(missing_ok=True)
    if not csv.is_file():
        return set()
    old = read_results(csv, (*settings, *keys))
    other = [k for k, v in settings.items() if k not in old or (old[k] != v).any()]
    if other:
        raise UserError(f"{csv} holds runs made with other settings ({', '.join(other)}); pass --fresh to start "
                        "over, or --out_dir for a separate folder")
    now = source_digest()
    codes = sorted({str(c) for c in old["code"]} - {now}) if "code" in old else ["unrecorded"]
    if codes and len(old):
        raise UserError(f"{csv} holds runs made by other neuroshard code (source digest {', '.join(codes)}; this code "
                        f"is {now}); pass --fresh to start over, or --out_dir for a separate folder")
    return set(zip(*(old[k] for k in keys)))


JSON_COLUMNS = ("loss_curve", "eval_curve")  # cells the reports parse
NUMERIC_SUFFIXES = ("_ms", "_per_step", "_auc", "_logloss", "_at_best", "_pairs", "_resolved")  # cells reports compute with


def read_results(csv, columns: tuple[str, ...]):
    """A benchmark's results CSV (a DataFrame), checked first: unreadable bytes, a file of another kind
    (no column of `columns`), a damaged JSON cell, or a measured cell (a column ending in NUMERIC_SUFFIXES) that
    is not a number or is infinite get one line instead of a traceback. An empty measured cell (a column a row
    predates) is kept."""
    import json

    import pandas as pd


    if not csv.is_file():
        raise UserError(f"no results in {csv} yet; run without --report_only first")
    check_results_csv(csv, "--out_dir:", columns, "benchmark")
    df = pd.read_csv(csv)
    for col in JSON_COLUMNS:
        for i, cell in enumerate(df[col] if col in df else []):
            try:
                json.loads(cell)
            except (TypeError, ValueError):
                raise UserError(f"--out_dir: {csv} row {i + 1}: {col} is not valid JSON; the file is damaged: move "
                                "it away or pass --fresh") from None
    for col in (c for c in df.columns if str(c).endswith(NUMERIC_SUFFIXES)):
        values = pd.to_numeric(df[col], errors="coerce")
        bad = (values.isna() & df[col].notna()) | np.isinf(values)
        if bad.any():
            i = int(bad.to_numpy().argmax())
            raise UserError(f"--out_dir: {csv} row {i + 1}: {col} is not a finite number "
                            f"({str(df[col].iloc[i])[:40]!r}); the file is damaged: move it away or pass --fresh")
    return df
