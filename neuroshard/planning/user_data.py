"""The user's tables on this machine: what `--measure` and `--calibrate` build before they measure.

Both allocate every table and synthesise (or read, with `--ids`) a batch of ids for each, split over the
ranks; `check_measure_budget` refuses, before any work, what this machine cannot hold, and
`user_tables_dataset` builds the tables as a processed dataset the measurement engine reads.
"""
from __future__ import annotations

from pathlib import Path

from ..core.errors import UserError
from ..data.dataset import process_raw
from ..data.raw import load_raw
from ..data.synthetic import popular_rows_first, synthesize_tables
from ..data.table_list import TableList

MEASURE_LIMIT_GB = 4.0  # --measure / --calibrate allocate every table: refuse more than this in total
MEASURE_MAX_LOOKUPS = 64_000_000  # ids per batch they may synthesise (~64 B each in all processes: ~4 GB)
MEASURE_BYTES_PER_LOOKUP = 64


def check_batch_divides(batch: int, ndevices: int) -> None:
    """Measuring splits the cost models' batch evenly over the ranks: refuse one they do not divide."""
    if batch % ndevices:
        raise UserError(f"--measure and --calibrate split the cost models' batch of {batch} over the ranks, and "
                        f"{ndevices} do not divide it; use a --ndevices that divides {batch}, or cost models "
                        f"collected at a batch it divides")


def check_tables_fit(tl: TableList) -> None:
    """Refuse more than MEASURE_LIMIT_GB of tables, which building them would allocate on this machine."""
    if tl.task.total_size_gb() > MEASURE_LIMIT_GB:
        raise UserError(f"--measure and --calibrate allocate every table on this machine: "
                        f"{tl.task.total_size_gb():.2f} GB is more than {MEASURE_LIMIT_GB:g} GB; measure a "
                        "scaled-down copy of the table list")


def check_measure_budget(tl: TableList, batch: int, ndevices: int = 1) -> None:
    """Before any work: --measure and --calibrate split the batch over the ranks, allocate every table and
    synthesise batch x pooling factor ids per table; refuse, with the numbers, a batch the ranks do not divide,
    more than MEASURE_LIMIT_GB of tables or MEASURE_MAX_LOOKUPS ids."""
    check_batch_divides(batch, ndevices)
    check_tables_fit(tl)
    per_table = batch * tl.task.pooling_factors
    lookups = float(per_table.sum())
    if lookups > MEASURE_MAX_LOOKUPS:
        t = int(per_table.argmax())
        raise UserError(f"--measure would synthesise {lookups / 1e6:,.1f} M ids for a batch of {batch} (about "
                        f"{lookups * MEASURE_BYTES_PER_LOOKUP / 2**30:,.1f} GB while they are made and measured; "
                        f"{tl.names[t]!r} alone {per_table[t] / 1e6:,.1f} M at pooling factor "
                        f"{tl.task.pooling_factors[t]:g}), more than the budget of {MEASURE_MAX_LOOKUPS / 1e6:g} M; "
                        "lower the pooling factors or measure fewer tables")


def user_tables_dataset(tl: TableList, batch_size: int, seed: int, out_dir: Path, ids_path=None,
                        popular_first: bool = False):
    """The user's tables as a processed dataset under `out_dir`: real ids (`ids_path`) or ids synthesised from
    each table's rows, pooling factor and reuse histogram (`popular_first`: renumbered hottest first,
    `synthetic.popular_rows_first`)."""
    check_tables_fit(tl)
    if ids_path is not None:
        indices, offsets, lengths = load_raw(ids_path)
        if lengths.shape[1] < batch_size:
            raise UserError(f"{ids_path} holds {lengths.shape[1]} samples per table; the cost models were trained at "
                            f"batch {batch_size}: give ids for at least {batch_size} samples")
        raw = (indices, offsets, lengths)
        source = {"source": "ids", "ids": str(ids_path)}
    else:
        raw = synthesize_tables(tl.rows, tl.task.pooling_factors, tl.task.data_features[:, 2:], batch_size, seed,
                                progress=False)
        source = {"source": "table list", "tables": tl.source, "seed": seed}
        if popular_first:
            raw = (popular_rows_first(*raw, tl.rows), *raw[1:])
            source["ids_order"] = "popular rows first"
    return process_raw(*raw, out_dir=Path(out_dir) / "user_tables", source=source, progress=False)
