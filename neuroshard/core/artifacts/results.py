"""Results files: the one results writer (every file atomic, with how it was made), and the check of a results
CSV a run will add to."""
from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UserError
from .atomic import atomic_write_text
from .provenance import provenance


def _cell(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return ";".join(f"{x:.4f}" for x in v.tolist())
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.6g}"
    return v


def _csv(rows) -> str:
    if hasattr(rows, "to_csv"):  # a DataFrame
        return rows.to_csv(index=False)
    fields: list[str] = []
    for r in rows:
        fields += [k for k in r if k not in fields]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields)
    w.writeheader()
    for r in rows:
        w.writerow({k: _cell(v) for k, v in r.items()})
    return buf.getvalue()


def write_results(path: str | os.PathLike, rows=None, *, markdown: str | None = None, record: dict | None = None,
                  **made_with: Any) -> Path:
    """A run's results, every file written atomically, named after `path`:
    - `rows` (dicts, one CSV row each, arrays as `;`-joined cells; or a DataFrame): the CSV at `path`, and
      `path.meta.json` recording how it was made (`provenance(**made_with)`);
    - `markdown`: its table, at `path` with the suffix `.md`;
    - `record`: at `path` with the suffix `.json`, with the run's provenance (`made_with`) first."""
    path = Path(path)
    if rows is not None:
        atomic_write_text(path, _csv(rows))
        atomic_write_text(path.with_name(path.name + ".meta.json"),
                          json.dumps(provenance(**made_with), indent=2, default=str))
    if markdown is not None:
        atomic_write_text(path.with_suffix(".md"), markdown)
    if record is not None:
        atomic_write_text(path.with_suffix(".json"),
                          json.dumps({"provenance": provenance(**made_with), **record}, indent=1, default=str))
    return path


def check_results_csv(path: str | os.PathLike | None, flag: str, columns: tuple[str, ...], what: str) -> None:
    """Before any work: an existing results CSV that a run would add to must be readable and of this kind
    (its header names `columns`); otherwise one line says so, so a finished run never fails at its end."""
    if path is None or not str(path) or not Path(path).exists():
        return
    import pandas as pd

    path = Path(path)
    try:
        head = list(pd.read_csv(path, nrows=0).columns)
        pd.read_csv(path)  # the whole file, as the run reads it to add its row
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0][:120]
        raise UserError(f"{flag} {path} is not a readable CSV ({type(e).__name__}: {first}); move it away or "
                        "choose another file") from None
    missing = [c for c in columns if c not in head]
    if missing:
        raise UserError(f"{flag} {path} is not a {what} results file (no column {missing[0]!r}); a run adds its row "
                        "to a file of its own kind: choose another file")
