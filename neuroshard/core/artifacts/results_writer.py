"""Results files: the one results writer (every file atomic, with how it was made), the one JSON writer (strict JSON:
`json_text`, `write_json`), and the check of a results CSV a run will add to."""
from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UserError
from ..file_names import meta_path
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


def json_text(obj: Any, indent: int | None = 1) -> str:
    """`obj` as strict JSON, the one way neuroshard writes JSON: a number that is not finite (NaN, an interval
    that one round cannot give) is written as null, never as a NaN or Infinity literal that strict readers
    refuse; what JSON has no type for is written as its text."""
    return json.dumps(_finite(obj), indent=indent, default=str, allow_nan=False)


def _finite(obj: Any) -> Any:
    if isinstance(obj, (float, np.floating)):
        return float(obj) if np.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _finite(obj.tolist())
    return obj


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 1) -> Path:
    """`json_text(obj)` written atomically at `path`."""
    return atomic_write_text(path, json_text(obj, indent))


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
        write_json(meta_path(path), provenance(**made_with), indent=2)
    if markdown is not None:
        atomic_write_text(path.with_suffix(".md"), markdown)
    if record is not None:
        write_json(path.with_suffix(".json"), {"provenance": provenance(**made_with), **record})
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
