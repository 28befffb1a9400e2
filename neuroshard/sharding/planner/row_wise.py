"""Row-wise tables in NeuroShard's search: a table no rank holds even in its narrowest column shards (or one whose
constraints allow only `row_wise`) is sharded row-wise, as TorchRec runs it: cut into `world` row blocks of
`ceil(rows / world)` rows (the last ones smaller, TorchRec's `calculate_shard_sizes_and_offsets`), block r on rank
r. Where the search then finds no plan, the largest
table that may go row-wise is added and the search runs again (`more_row_wise`). Where tables go row-wise, more may
by cost: a round tries each of the next `ROW_WISE_CANDIDATES` tables added, and all the rest at once (no table-wise
group left), and keeps the one whose plan is rated cheapest, by at least `ROW_WISE_MIN_GAIN`; rounds go on while one
is (`NeuroShardPlanner._more_row_wise_by_cost`). The search sees each block as a
table of its own, pinned to its rank (`ShardingTask.row_block`): its rows, the
share of the table's lookups that falls in it and its reuse histogram (measured from the ids the caller gives,
`NeuroShardPlanner(ids=)`: hot rows make blocks unequal; without them, ids spread evenly over the rows with the
table's histogram), its storage as TorchRec's
estimator counts a row-wise shard. The step cost prices the blocks as TorchRec's row-wise sharding group
(`simulator.py`); the rest of the tables are placed around them.

A small table runs data-parallel (`data_parallel_tables`, under the step cost) when its gradient all-reduce moves
fewer floats per rank than its pooled output's all-to-all: a replica pinned to every rank (`ShardingTask.replica`)
doing that rank's local batch (its features are its table's; the step cost prices the replicas' operator,
`Simulator.replica_compute_ms`), its storage as TorchRec counts a replica.

TorchRec's `EmbeddingBagCollectionSharder` offers `row_wise` on CUDA only; `sharders.RowWiseSharder` offers it on
CPU too (and runs in `DistributedModelParallel` on gloo ranks). A table whose row type is `grid_shard` or
`table_row_wise` (one host) has the same blocks, in the step cost's group of that type (`ShardingTask.type_group`).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...core.errors import UserError
from ...data.features import MIN_ROWS, ids_reuse_histogram
from ...data.tasks import ShardStorage
from ..simulator import allreduce_floats, own_group
from .types import DATA_PARALLEL, DENSE, FUSED, ROW_WISE, Enumeration


def row_blocks(rows: int, world: int) -> list[tuple[int, int]]:
    """(row offset, rows) of each of the `world` row blocks TorchRec cuts a table of `rows` rows into, block r on
    rank r."""
    import torch
    from torchrec.distributed.sharding_plan import calculate_shard_sizes_and_offsets

    sizes, offsets = calculate_shard_sizes_and_offsets(torch.empty((int(rows), 1), device="meta"), world, world,
                                                       ROW_WISE)
    return [(int(o[0]), int(s[0])) for s, o in zip(sizes, offsets)]


def needs_row_wise(found: Enumeration, fits) -> list[int]:
    """The tables to shard row-wise: those that allow it and either allow nothing else or fit no rank (`fits(gb)`)
    even in their narrowest column shard."""
    task, out = found.task, []
    for t, table in enumerate(found.tables):
        if not table.row_wise:
            continue
        if table.row_wise_only or not fits(float(task.shard_sizes_gb([t], [table.narrowest(task.dims[t])])[0])):
            out.append(t)
    return out


def more_row_wise(found: Enumeration, row_wise: list[int]) -> list[int]:
    """The tables that may go row-wise and are not in `row_wise`, the largest (storage whole, as counted) first:
    the order in which `NeuroShardPlanner` shards more tables row-wise while its search finds no plan."""
    task = found.task
    rest = [t for t, table in enumerate(found.tables) if table.row_wise and t not in row_wise]
    size = {t: float(task.shard_sizes_gb([t], [task.dims[t]])[0]) for t in rest}
    return sorted(rest, key=lambda t: (-size[t] if np.isfinite(size[t]) else -np.inf, t))


ROW_WISE_CANDIDATES = 8   # where tables already go row-wise: the next tables that may, tried one at a time a round
ROW_WISE_ROUNDS = 4       # rounds of adding one more row-wise table by cost, at most
ROW_WISE_MIN_GAIN = 0.01  # the rated step cost a table added row-wise must save, at least


def row_wise_attempts(found: Enumeration, needed: list[int], replica_sets: list[list[int]]):
    """The (row-wise tables, replicated tables) `NeuroShardPlanner` searches with, in order, until one finds a plan:
    for each set of replicas in turn, the tables in `needed` row-wise, then with the next table that may go row-wise
    (`more_row_wise`) added at a time; a row-wise table is never also replicated."""
    for replicated in replica_sets:
        row_wise, spare = list(needed), more_row_wise(found, needed)
        while True:
            yield row_wise, [t for t in replicated if t not in row_wise]
            if not spare:
                break
            row_wise = sorted(row_wise + [spare.pop(0)])


def data_parallel_tables(found: Enumeration, row_wise: list[int], world: int, batch_size: int,
                         by_rule: bool = True) -> list[int]:
    """The tables to run data-parallel: those that allow it, are not row-wise, and either allow nothing else or
    have a gradient all-reduce that moves fewer floats per rank than their pooled output's all-to-all
    (2 (N - 1) / N x rows < the global batch; only `by_rule`: the step cost, which prices that all-reduce)."""
    return [t for t, table in enumerate(found.tables) if table.data_parallel and t not in row_wise
            and (table.data_parallel_only or (by_rule and allreduce_floats(found.task.rows[t], world) < batch_size))]


def with_row_blocks(found: Enumeration, row_wise: list[int], world: int, memory_kind: str,
                    data_parallel: list[int] = ()) -> Enumeration:
    """`found` with each table in `row_wise` replaced by its `world` row blocks and each in `data_parallel` by its
    `world` replicas (module docstring), in place; the storage of a block or replica is TorchRec's count of that
    shard."""
    if not row_wise and not data_parallel:
        return found
    if found.storage is None:
        raise UserError("row-wise and data-parallel tables need the storage counter of NeuroShardPlanner's own "
                        "enumerator; pass no enumerator= or one that sets Enumeration.storage")
    task, field = found.task, "ddr" if memory_kind == "DDR" else "hbm"
    entries = []  # (the entry, its table-list row, the table it comes from, its rows, its storage GB or None, its
    # first row in the table)
    for t, table in enumerate(found.tables):
        rows_t = int(task.rows[t])
        if t in data_parallel:
            counted = found.storage.shards(table.module_path, table.name, DATA_PARALLEL, DENSE, None)
            if counted is None or len(counted) != world:
                raise UserError(f"{table.where}: TorchRec's enumerator gives it no {DATA_PARALLEL} {DENSE} option")
            entries += [(replace(table, replica=r, splittable=False, column_wise_only=False), found.rows[t], t, rows_t,
                         getattr(storage, field) / 2**30, 0) for r, storage in enumerate(counted)]
        elif t in row_wise:
            blocks = row_blocks(rows_t, world)
            counted = found.storage.shards(table.module_path, table.name, table.row_wise_type, FUSED,
                                           [(n, int(task.dims[t])) for _, n in blocks])
            if counted is None:
                raise UserError(f"{table.where}: TorchRec's enumerator gives it no {table.row_wise_type} {FUSED} option; "
                                f"allow {table.row_wise_type!r} and {FUSED!r} in its ParameterConstraints")
            entries += [(replace(table, row_block=r, splittable=False, column_wise_only=False),
                         {**found.rows[t], "rows": n}, t, n, getattr(storage, field) / 2**30, first)
                        for r, ((first, n), storage) in enumerate(zip(blocks, counted))]
        else:
            entries.append((table, found.rows[t], t, rows_t, None, 0))
    tables, rows, origin, block_rows, block_gb, first_row = (list(x) for x in zip(*entries))
    origin_a = np.asarray(origin, np.int64)
    block_a = np.array([e.row_block for e in tables], np.int64)
    replica_a = np.array([e.replica for e in tables], np.int64)
    n_rows = np.asarray(block_rows, np.float64)
    features = task.data_features[origin_a].copy()
    is_block, pinned = block_a >= 0, (block_a >= 0) | (replica_a >= 0)
    share = np.where(is_block, n_rows / np.maximum(task.rows[origin_a], 1), 1.0)  # a replica: its table's features
    ids, shares = {}, {}
    for i, (e, t) in enumerate(zip(tables, origin)):  # where the caller gave a table's ids: each block's share, histogram
        table_ids = (found.ids or {}).get(t)
        if table_ids is None or e.replica >= 0:
            continue
        if e.row_block < 0:  # whole: every id is below its rows (`EmbeddingBagEnumerator` checked)
            ids[i] = table_ids
            continue
        lo = first_row[i]
        inside = table_ids[(table_ids >= lo) & (table_ids < lo + block_rows[i])] - lo
        ids[i] = inside
        share[i] = inside.size / table_ids.size
        shares.setdefault(t, []).append(share[i])
        features[i, 2:] = ids_reuse_histogram(inside)
    features[is_block, 0] = np.maximum(MIN_ROWS, n_rows[is_block])
    features[:, 1] = features[:, 1] * share  # the block's share of the table's lookups
    storage = task.storage
    if storage is not None:
        gb = storage.gb[origin_a].copy()
        for i, b in enumerate(block_gb):
            if b is not None:  # a block or replica is never cut into columns: those widths fit no rank
                gb[i] = np.where(np.isnan(gb[i]), np.nan, np.inf)
                gb[i, 0] = b
        storage = ShardStorage(task.dims[origin_a], gb)
    new_task = replace(task, table_ids=task.table_ids[origin_a], dims=task.dims[origin_a], data_features=features,
                       num_rows=n_rows, column_wise=None if task.column_wise is None else
                       np.asarray(task.column_wise, bool)[origin_a] & ~pinned,
                       storage=storage, row_block=block_a, replica=replica_a,
                       type_group=np.array([own_group(e.row_wise_type) if e.row_block >= 0 else -1 if e.replica >= 0
                                            else -1 if task.type_group is None else int(task.type_group[t])
                                            for e, t in zip(tables, origin)], np.int64))
    no_split = frozenset(i for i, t in enumerate(origin) if t in found.no_split or pinned[i])
    notes = []
    if row_wise:
        notes.append(f"note: {len(row_wise)} table(s) sharded {ROW_WISE} in {world} row blocks (no rank holds them "
                     f"even in their narrowest column shards, their constraints allow only {ROW_WISE}, the search "
                     f"found no plan without, or the step costs less): "
                     f"{', '.join(found.tables[t].qualified_name for t in row_wise)}")
    if shares:
        notes.append("note: the row blocks' shares of their table's lookups, from the ids given: " + "; ".join(
            f"{found.tables[t].qualified_name} {'/'.join(f'{x:.2f}' for x in s)}" for t, s in shares.items()))
    if data_parallel:
        notes.append(f"note: {len(data_parallel)} small table(s) run {DATA_PARALLEL} (a replica on every rank: their "
                     "gradient all-reduce moves fewer floats than their pooled output's all-to-all): "
                     f"{', '.join(found.tables[t].qualified_name for t in data_parallel)}")
    return replace(found, tables=tables, rows=rows, task=new_task, no_split=no_split, notes=found.notes + notes,
                   ids=ids)
