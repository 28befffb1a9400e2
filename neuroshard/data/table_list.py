"""A user's own tables: a table list (CSV or JSON) or real ids -> a `ShardingTask` with names.

Table list columns (CSV header or JSON keys, one table per row/object):
    name, rows, dim, pooling_factor            required
    bin_0 .. bin_16                            optional reuse histogram (DESIGN.md §2.2): share of the
                                               table's unique ids read c times, c in (2^(j-1), 2^j]
A table without reuse statistics gets `DEFAULT_REUSE_HISTOGRAM` — the published histogram of the
DLRM dataset (DESIGN.md §2.1), renormalised to sum to 1 — and the tools say so. The feature `row`
is max(100, rows), as for dataset tables. Every bad row is answered with one line naming the row
(its line in a CSV, its position in a JSON list) and the problem.

`--ids FILE` takes real ids in the raw DLRM format instead (DESIGN.md §2.1): rows, pooling factors
and reuse histograms are computed from the ids exactly as for a dataset, dims come from the user.
"""
from __future__ import annotations

import csv
import io
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.artifacts import read_json, read_text
from ..core.errors import UserError
from .features import MIN_ROWS, NUM_BINS, smallest_shard_dim, table_data_features
from .raw import load_raw, max_rows_any_device
from .synthetic import PUBLISHED_REUSE_UNIQUE_SHARE, SyntheticConfig
from .tasks import ShardingTask

REQUIRED = ("name", "rows", "dim", "pooling_factor")
BIN_COLUMNS = tuple(f"bin_{j}" for j in range(NUM_BINS))
DEFAULT_REUSE_HISTOGRAM = PUBLISHED_REUSE_UNIQUE_SHARE / PUBLISHED_REUSE_UNIQUE_SHARE.sum()
MAX_DIM = 4096
MAX_ROWS = max_rows_any_device()   # a table whose 4-wide column shard fits no device is refused
MAX_POOLING = 1e6                  # mean lookups per sample; beyond this it is not an embedding bag
TRAINED_POOLING_MAX = SyntheticConfig.max_pooling  # the cost models' training tables: warn beyond this
MAX_TABLES = 100_000
MAX_NAME_CHARS = 200
FIX = "pass a CSV or JSON table list of UTF-8 text (see README)"
HIST_TOL = 0.01


@dataclass
class TableList:
    """The user's tables as a task, with their names and which got the default reuse histogram."""

    names: list[str]
    rows: np.ndarray          # the tables' real row counts (the feature `row` is max(100, rows))
    task: ShardingTask
    defaulted_reuse: list[str]
    source: str


def priced_dim(dim) -> bool:
    """Whether the cost models price a table of this dim: a multiple of 4 from 4 to `MAX_DIM`."""
    return dim % 4 == 0 and 4 <= dim <= MAX_DIM


def _rows_from_file(path: Path) -> list[tuple[str, dict]]:
    """(where, row dict) per table of a CSV or JSON table list."""
    if path.suffix.lower() == ".json":
        obj = read_json(path, "--tables file", "table list", FIX)
        if isinstance(obj, dict):
            obj = obj.get("tables")
        if not isinstance(obj, list) or not all(isinstance(r, dict) for r in obj):
            raise UserError(f"{path}: expected a JSON list of tables (objects with {', '.join(REQUIRED)}) "
                            'or {"tables": [...]}')
        return [(f"{path} table {i + 1}", r) for i, r in enumerate(obj)]
    reader = csv.DictReader(io.StringIO(read_text(path, "--tables file", "table list", FIX), newline=""))
    rows = []
    try:
        if reader.fieldnames is None:
            raise UserError(f"{path}: empty table list; write a header line {','.join(REQUIRED)} and one line per "
                            "table")
        header = [(f or "").strip() for f in reader.fieldnames]
        twice = sorted({f for f in header if header.count(f) > 1})
        if twice:
            raise UserError(f"{path}: the header names column {twice[0]!r} more than once; name each column once")
        missing = [c for c in REQUIRED if c not in header]
        if missing:
            near = next((f for f in header if f.lower() == missing[0]), None)
            raise UserError(f"{path}: header lacks column {missing[0]!r}"
                            + (f" (it has {near!r}: column names are lower case)" if near else "")
                            + f"; the header must name {', '.join(REQUIRED)}")
        for r in reader:
            where = f"{path} line {reader.line_num}"
            if None in r:
                raise UserError(f"{where}: more fields than the header names; quote names that hold a comma")
            rows.append((where, {(k or "").strip(): v for k, v in r.items()}))
    except csv.Error as e:
        raise UserError(f"{path} near line {reader.line_num + 1}: not a CSV line ({e}); fix the file") from None
    return rows


def _number(where: str, r: dict, key: str) -> float:
    v = r.get(key)
    if v is None or (isinstance(v, str) and not v.strip()):
        raise UserError(f"{where}: missing {key}; every table needs {', '.join(REQUIRED)}")
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise UserError(f"{where}: {key} must be a number, got {v!r}"[:300])
    try:
        x = float(v)
    except (TypeError, ValueError, OverflowError):
        raise UserError(f"{where}: {key} must be a number, got {v!r}"[:300]) from None
    if not math.isfinite(x):
        raise UserError(f"{where}: {key} must be finite, got {v!r}"[:300])
    return x


def _name(where: str, r: dict) -> str:
    v = r.get("name")
    if v is not None and not isinstance(v, str):
        raise UserError(f"{where}: name must be text, got {type(v).__name__} {v!r}"[:300])
    name = (v or "").strip()
    if not name:
        raise UserError(f"{where}: missing name; every table needs {', '.join(REQUIRED)}")
    if len(name) > MAX_NAME_CHARS or any(not c.isprintable() for c in name):
        raise UserError(f"{where}: table name {name[:60]!r} must be one line of printable text of at most "
                        f"{MAX_NAME_CHARS} characters")
    return name


def check_reuse(where: str, hist: np.ndarray, pooling_factor: float) -> np.ndarray:
    """A table's reuse histogram (bin_0..bin_16): shares in [0, 1] that sum to 1, or all zero for a table without
    lookups (pooling factor 0); one line naming the bins that are not shares, or the sum, otherwise."""
    bad = [f"{c} = {v:g}" for c, v in zip(BIN_COLUMNS, hist) if not 0 <= v <= 1]
    if bad:
        raise UserError(f"{where}: bin_0..bin_16 must be shares in [0, 1], got {', '.join(bad[:3])}"
                        f"{', ...' if len(bad) > 3 else ''}")
    total = hist.sum()
    if abs(total - 1) > HIST_TOL and not (total == 0 and pooling_factor == 0):
        empty = " (all zero: only a table without lookups, pooling_factor 0, has none; give its histogram, or leave " \
                "bin_0..bin_16 empty for the published DLRM one)" if total == 0 else ""
        raise UserError(f"{where}: bin_0..bin_16 must be shares that sum to 1, got sum {total:.3f}{empty}")
    return hist


def parse_table_rows(rows: list[tuple[str, dict]], max_mem_gb: float | None, source: str) -> TableList:
    """Validate table rows and build the task (features: row, pooling factor, reuse histogram)."""
    if not rows:
        raise UserError(f"{source}: no tables; add one line (or object) per table")
    if len(rows) > MAX_TABLES:
        raise UserError(f"{source}: {len(rows):,} tables is more than {MAX_TABLES:,}; split the list")
    names, n_rows_all, dims, feats, defaulted, seen, unusual_pf = [], [], [], [], [], {}, []
    for where, r in rows:
        name = _name(where, r)
        if name in seen:
            raise UserError(f"{where}: duplicate table name {name!r} (also at {seen[name]}); names must be unique")
        seen[name] = where
        n_rows, dim, pf = (_number(where, r, k) for k in ("rows", "dim", "pooling_factor"))
        if n_rows < 1 or not n_rows.is_integer() or n_rows > MAX_ROWS:
            raise UserError(f"{where}: rows must be a whole number from 1 to {MAX_ROWS:,} (a table any device can "
                            f"hold), got {r.get('rows')!r}")
        if not dim.is_integer() or not priced_dim(dim):
            raise UserError(f"{where}: dim must be a multiple of 4 between 4 and {MAX_DIM}, got {r.get('dim')!r}")
        if pf < 0 or pf > MAX_POOLING:
            raise UserError(f"{where}: pooling_factor must be from 0 to {MAX_POOLING:g} (mean lookups per sample), "
                            f"got {r.get('pooling_factor')!r}")
        if pf > TRAINED_POOLING_MAX:
            unusual_pf.append(f"{name} ({pf:g})")
        given = [c for c in BIN_COLUMNS if r.get(c) not in (None, "")]
        if given and len(given) != NUM_BINS:
            absent = [c for c in BIN_COLUMNS if c not in given]
            raise UserError(f"{where}: reuse histogram incomplete ({absent[0]} missing); give all of bin_0..bin_16 "
                            "or none")
        if given:
            hist = check_reuse(where, np.array([_number(where, r, c) for c in BIN_COLUMNS]), pf)
        else:
            hist = np.zeros(NUM_BINS) if pf == 0 else DEFAULT_REUSE_HISTOGRAM
            if pf > 0:
                defaulted.append(name)
        size_gb = n_rows * dim * 4 / 2**30
        if max_mem_gb is not None:
            smallest = smallest_shard_dim(dim)
            if n_rows * smallest * 4 / 2**30 > max_mem_gb + 1e-9:
                raise UserError(f"{where}: table {name!r} ({size_gb:.4g} GB) does not fit a device of {max_mem_gb:g} GB "
                                f"even split into column shards of {smallest}; raise --max_mem or shrink the table")
        names.append(name)
        n_rows_all.append(int(n_rows))
        dims.append(int(dim))
        feats.append(np.concatenate([[max(MIN_ROWS, n_rows), pf], hist]))
    unknown = sorted({str(k) for _, r in rows for k in r if k not in REQUIRED and k not in BIN_COLUMNS})
    if unknown:  # a misspelt bin_j or pooling column would otherwise be dropped without a word
        print(f"warning: column(s) {', '.join(repr(k)[:40] for k in unknown[:5])}{', ...' if len(unknown) > 5 else ''} "
              f"are not read (a table list has {', '.join(REQUIRED)} and optionally bin_0..bin_16)", file=sys.stderr)
    if unusual_pf:
        print(f"warning: {len(unusual_pf)} table(s) have pooling factors far outside the 0..{TRAINED_POOLING_MAX:g} "
              f"the cost models were trained on (DLRM dataset tables): {', '.join(unusual_pf[:5])}"
              f"{', ...' if len(unusual_pf) > 5 else ''}; their predicted costs are extrapolations", file=sys.stderr)
    rows = np.array(n_rows_all, dtype=np.int64)
    task = ShardingTask(np.arange(len(names)), np.array(dims, dtype=np.int64), np.array(feats, dtype=np.float64), rows)
    return TableList(names, rows, task, defaulted, source)


def load_table_list(path: str | Path, max_mem_gb: float | None = None) -> TableList:
    path = Path(path)
    return parse_table_rows(_rows_from_file(path), max_mem_gb, str(path))


def tables_from_ids(path: str | Path, dims: list[int], max_mem_gb: float | None = None) -> TableList:
    """Tables from real ids (raw DLRM format) with user-given dims (one per table, or one for all)."""
    indices, offsets, lengths = load_raw(path, "--ids")
    T, B = lengths.shape
    dims = list(dims)
    if len(dims) == 1:
        dims = dims * T
    if len(dims) != T:
        raise UserError(f"--dims gives {len(dims)} dims but {path} has {T} tables; give one per table or one for all")
    ind, off, lens = indices.numpy(), offsets.numpy(), lengths.numpy()
    rows = []
    for t in range(T):
        f = table_data_features(ind[off[t * B]: off[(t + 1) * B]], lens[t])
        r = {"name": f"table_{t}", "rows": f[0], "dim": dims[t], "pooling_factor": f[1]}
        if f[1] > 0:
            r.update({c: v for c, v in zip(BIN_COLUMNS, f[2:])})
        rows.append((f"{path} table {t}", r))
    return parse_table_rows(rows, max_mem_gb, str(path))
