"""The enumerator: every table of every `EmbeddingBagCollection` a sharder shards, with the options its
`ParameterConstraints` and sharder allow (TorchRec's `EmbeddingEnumerator` in NeuroShard's terms).

- Tables: rows and dim from each table's weight; the pooling factor is the sum over the table's features
  of `pooling_factors` (times `num_poolings` where given); a table without constraints gets TorchRec's
  default, 1.0 (`POOLING_FACTOR`), and a note says so. The reuse histogram is measured from the ids the caller
  gives for a table (`ids=`: a batch's lookups), else the published DLRM one (as for a table list without `bin_*`
  columns); the ids also give its row blocks' shares of the lookups (`row_wise.py`). Dims must be multiples of 4.
- Sharding types: NeuroShard places tables whole (`table_wise`), in column halves (`column_wise`) or, where no
  rank holds a table even in its narrowest column shard, in row blocks (`row_wise`, `row_wise.py`; handed out
  as `table_row_wise` where only that is allowed and the topology is one host, on which TorchRec cuts both
  alike); column shards go `table_column_wise` where that is allowed and `column_wise` is not, on one host
  (the same column blocks, run in a sharding group of their own, which the step cost prices), and row blocks
  `grid_shard` where only that row type is allowed, on one host (each rank its rows of every column, as row-wise;
  TorchRec offers it only where constraints name it); a table that allows only table-wise is never split, one that
  allows only column-wise is handed out column-wise (one block when the search keeps it whole), one that allows
  only row-wise goes row-wise, one that allows none of them gets TorchRec's plan (or is refused). The sharder's own
  sharding types count as well (TorchRec's sharder offers row_wise on cuda only; `sharders.RowWiseSharder` on cpu
  too). `data_parallel` (on TorchRec's `dense` kernel) is allowed where the constraints, the sharder and the
  kernels allow it (`row_wise.py` picks the small tables that run so). Kernel: `fused`; a table excluding it is refused.
- Storage: each shard the search can cut is counted as TorchRec counts it (`storage.StorageCounter`: weights,
  optimizer state, input and output buffers, on the planner's topology and batch); `check_fits` refuses a table
  whose narrowest allowed shard fits no rank's budget, before any search.
"""
from __future__ import annotations

import logging
import math
import operator
from dataclasses import replace

import numpy as np
from torch import nn

from ...core.errors import UserError
from ...core.costs import Cluster
from ...data.features import can_split, ids_reuse_histogram, table_size_gb
from ...data.table_list import BIN_COLUMNS, MAX_DIM, parse_table_rows, priced_dim
from .storage import StorageCounter, planned_constraints
from ..simulator import own_group
from .types import (COLUMN_WISE, COLUMN_WISE_KINDS, DATA_PARALLEL, DENSE, FUSED, GRID_SHARD, ROW_WISE, ROW_WISE_KINDS,
                    TABLE_COLUMN_WISE, TABLE_ROW_WISE, TABLE_WISE, Enumeration, Enumerator, PlannedTable)

# the sharding types NeuroShardPlanner places
PLACED = (TABLE_WISE, COLUMN_WISE, TABLE_COLUMN_WISE, ROW_WISE, TABLE_ROW_WISE, GRID_SHARD)
ONE_HOST = (TABLE_ROW_WISE, TABLE_COLUMN_WISE, GRID_SHARD)  # placed on a topology of one host only

DEFAULT_POOLING_FACTOR = 1.0  # TorchRec's torchrec.distributed.planner.constants.POOLING_FACTOR
logger = logging.getLogger(__name__)


class EmbeddingBagEnumerator(Enumerator):
    def __init__(self, constraints: dict, device_type: str, topology, batch_size: int, memory_kind: str,
                 ids: dict[str, np.ndarray] | None = None):
        self.constraints, self.device_type = constraints, device_type
        self.topology, self.batch_size, self.memory_kind = topology, batch_size, memory_kind
        self.ids = ids or {}  # table name -> its ids (`arguments.checked_ids`)

    def enumerate(self, module, sharders) -> Enumeration:
        tables, rows, defaulted, unpriced = [], [], [], []
        for path, ebc, sharder in find_ebcs(module, sharders):
            for name, param in sharder.shardable_parameters(ebc).items():
                table, row, default = self._table(path, name, param, sharder)
                tables.append(table)
                rows.append((table.where, row))
                defaulted += [table.qualified_name] if default else []
                unpriced += unpriced_fields(self.constraints.get(name), table.qualified_name)
        if not rows:
            raise UserError("the module's EmbeddingBagCollections hold no tables; give them EmbeddingBagConfigs")
        unknown = sorted(set(self.constraints) - {t.name for t in tables})
        if unknown:  # most likely a misspelt name: its constraints would be lost without a word
            logger.warning("NeuroShardPlanner: constraints name table(s) no planned EmbeddingBagCollection has, "
                           "unused: %s; use the names of the EmbeddingBagConfigs", _names(unknown))
        unknown_ids = sorted(set(self.ids) - {t.name for t in tables})
        if unknown_ids:
            raise UserError(f"ids= names table(s) no planned EmbeddingBagCollection has: {_names(unknown_ids)}; use "
                            "the names of the EmbeddingBagConfigs")
        task = parse_table_rows(rows, None, "the module's EmbeddingBagCollections").task
        task = replace(task, column_wise=np.array([t.column_wise_only for t in tables], bool),  # priced as run
                       type_group=np.array([own_group(t.column_wise_type) for t in tables], np.int64))
        counter = StorageCounter(self.topology, self.batch_size, planned_constraints(self.constraints, tables),
                                 module, sharders)
        task = replace(task, storage=counter.halvings(tables, task.rows, task.dims, self.memory_kind))
        ids = {t: self.ids[table.name] for t, table in enumerate(tables) if table.name in self.ids}
        return Enumeration(tables, [row for _, row in rows], task,
                           frozenset(t for t, table in enumerate(tables) if table.narrowest(task.dims[t]) == task.dims[t]),
                           _notes(defaulted, unpriced, unknown, len(ids) < len(tables)), counter, ids)

    def _table(self, path: str, name: str, param, sharder) -> tuple[PlannedTable, dict, bool]:
        """The table, its row for the table list, and whether its pooling factor is TorchRec's default."""
        where = PlannedTable(path, name, False, False).where
        c = self.constraints.get(name)
        wanted = getattr(c, "sharding_types", None)
        kernels = getattr(c, "compute_kernels", None) or None  # [] constrains nothing, as in TorchRec
        offered = set(sharder.sharding_types(self.device_type))
        data_parallel = DATA_PARALLEL in set(wanted or [DATA_PARALLEL]) and DATA_PARALLEL in offered and (
            kernels is None or DENSE in kernels)
        allowed = set(PLACED) & set(wanted or set(PLACED) - {GRID_SHARD})  # grid: where named (TorchRec's rule)
        unplaced = ""  # why the search cannot place it: TorchRec's planner's plan may still be handed out
        if not allowed and not data_parallel:
            unplaced = (f"{where}: its ParameterConstraints.sharding_types {list(wanted)} allow none of "
                        f"{', '.join(PLACED + (DATA_PARALLEL,))}, the sharding types NeuroShardPlanner places; add one "
                        "of them")
        allowed &= offered
        hosts = allowed & set(ONE_HOST)
        if hosts and getattr(self.topology, "local_world_size", None) != getattr(self.topology, "world_size", None):
            allowed -= hosts  # on several hosts they cut a table over one host's ranks only
            if not allowed and not data_parallel and not unplaced:
                unplaced = (f"{where}: it allows only {' and '.join(sorted(hosts))} of the types NeuroShardPlanner "
                            "places, which it places on a topology of one host only (local_world_size = world_size)")
        if not allowed and not data_parallel and not unplaced:
            unplaced = (f"{where}: its sharder {type(sharder).__name__} offers none of "
                        f"{', '.join(sorted(set(PLACED) & set(wanted or PLACED)))} on {self.device_type}; pass "
                        "torchrec's EmbeddingBagCollectionSharder() (or neuroshard.sharding.planner.sharders."
                        "RowWiseSharder() for row_wise on cpu)")
        rows, dim = (int(x) for x in param.shape)
        if allowed and kernels is not None and FUSED not in kernels:  # sharded, only on a kernel not priced
            allowed = set()
            if not data_parallel and not unplaced:
                unplaced = (f"{where}: its compute_kernels {list(kernels)} exclude {FUSED!r}, the kernel NeuroShard's "
                            f"cost models measure; allow {FUSED!r}")
        # the table list takes priced dims only; such a table is never placed by the search, so the nearest one stands in
        row_dim = dim if priced_dim(dim) else min(max(4, -(-dim // 4) * 4), MAX_DIM)
        if row_dim != dim and not unplaced:  # the cost models' widths: TorchRec's plan may still be handed out
            unplaced = (f"{where}: its dim {dim} is not a multiple of 4 between 4 and {MAX_DIM}, the widths "
                        "NeuroShard's cost models price")
        refuse_unplanned_fields(c, where, self.device_type, self.batch_size)
        pooling = DEFAULT_POOLING_FACTOR
        if c is not None:
            factors, counts = getattr(c, "pooling_factors", None), getattr(c, "num_poolings", None)
            try:
                factors = [_number(x) for x in factors]
                counts = [1.0] * len(factors) if counts is None else [_number(x) for x in counts]
            except (TypeError, ValueError):
                raise UserError(f"{where}: pooling_factors and num_poolings must be lists of numbers, got "
                                f"pooling_factors={getattr(c, 'pooling_factors', None)!r}, num_poolings="
                                f"{getattr(c, 'num_poolings', None)!r}"[:300]) from None
            if not factors or not all(math.isfinite(x) and x >= 0 for x in factors):
                raise UserError(f"{where}: pooling_factors must be finite numbers >= 0 (mean lookups per sample, one per "
                                f"feature), got {factors!r}"[:300])
            if len(counts) != len(factors) or not all(math.isfinite(x) and x >= 0 for x in counts):
                raise UserError(f"{where}: num_poolings must be finite numbers >= 0, one per pooling factor "
                                f"({len(factors)}), got {counts!r}"[:300])
            pooling = sum(f * n for f, n in zip(factors, counts))
        measured = {}
        if name in self.ids:
            ids = self.ids[name]
            if int(ids.max()) >= rows:
                raise UserError(f"{where}: ids[{name!r}] holds id {int(ids.max())}, beyond its {rows:,} rows; pass the "
                                "ids the table is looked up with (row numbers below its rows)")
            measured = dict(zip(BIN_COLUMNS, ids_reuse_histogram(ids).tolist()))
        columns = bool(allowed & set(COLUMN_WISE_KINDS))
        table = PlannedTable(path, name, columns and TABLE_WISE not in allowed, columns,
                             min_width(c, where), bool(allowed & set(ROW_WISE_KINDS)),
                             not allowed & {TABLE_WISE, *COLUMN_WISE_KINDS}, data_parallel=data_parallel,
                             data_parallel_only=not allowed and data_parallel, unplaced=unplaced,
                             row_wise_type=next((k for k in ROW_WISE_KINDS if k in allowed), ROW_WISE),
                             column_wise_type=TABLE_COLUMN_WISE if columns and COLUMN_WISE not in allowed
                             else COLUMN_WISE)
        return table, {"name": table.qualified_name, "rows": rows, "dim": row_dim, "pooling_factor": pooling,
                       **measured}, c is None


# ParameterConstraints fields each ParameterSharding of the plan carries as the caller set them (as TorchRec's planner
# copies them from its sharding options); the fused kernel's cost does not depend on them
PASSED_TO_PLAN = ("cache_params", "enforce_hbm", "stochastic_rounding", "bounds_check_mode", "output_dtype")


def refuse_unplanned_fields(c, where: str, device_type: str, batch_size: int) -> None:
    """One line for a ParameterConstraints field NeuroShardPlanner cannot honour: another device group, an SSD or
    virtual table, per-feature batch sizes other than the planner's batch."""
    if c is None:
        return
    group = getattr(c, "device_group", None)
    if group is not None and group != device_type:
        raise UserError(f"{where}: ParameterConstraints.device_group={group!r} differs from the topology's compute_device "
                        f"{device_type!r}; NeuroShardPlanner plans one device group: leave device_group out, or plan "
                        "the model with EmbeddingShardingPlanner")
    if getattr(c, "key_value_params", None) is not None or getattr(c, "use_virtual_table", False):
        raise UserError(f"{where}: ParameterConstraints.key_value_params / use_virtual_table ask for an SSD or virtual "
                        f"table, which NeuroShardPlanner does not place (it places {FUSED!r} tables); leave them out, or "
                        "plan the model with EmbeddingShardingPlanner")
    sizes = getattr(c, "batch_sizes", None)
    if sizes is not None and any(b != batch_size for b in sizes):
        raise UserError(f"{where}: ParameterConstraints.batch_sizes={list(sizes)} differ from the planner's batch_size "
                        f"{batch_size}; NeuroShard's cost models price one batch for every feature: leave batch_sizes "
                        "out, or plan the model with EmbeddingShardingPlanner")


def min_width(c, where: str) -> int:
    """`min_partition` (TorchRec: the narrowest column-wise shard), checked; 4 where not given."""
    value = getattr(c, "min_partition", None)
    if value is None:
        return 4
    try:
        whole = operator.index(value) if not isinstance(value, bool) else 0
    except TypeError:
        whole = 0
    if whole < 1:
        raise UserError(f"{where}: ParameterConstraints.min_partition must be a whole number >= 1 (the narrowest "
                        f"column shard), got {value!r}")
    return max(4, whole)


def unpriced_fields(c, name: str) -> list[str]:
    """'name (field)' for each field set that the plan carries but the cost models do not price."""
    if c is None:
        return []
    dtype = getattr(c, "output_dtype", None)
    fields = (["is_weighted"] if getattr(c, "is_weighted", False) else []) + (
        ["output_dtype"] if dtype is not None and getattr(dtype, "name", str(dtype)) != "FP32" else [])
    return [f"{name} ({', '.join(fields)})"] if fields else []


def check_fits(found: Enumeration, cluster: Cluster, memory_kind: str, reserved: str) -> None:
    """Every table's narrowest allowed shard fits one rank's budget (`reserved`: what the budget is after), else one
    line naming the table, its storage, the budget and what would make it fit."""
    task = found.task
    unplaced = [t.unplaced for t in found.tables if t.unplaced]
    if unplaced:
        raise NoRoom(unplaced[0], [])
    for t, table in enumerate(found.tables):
        dim = table.narrowest(task.dims[t])
        need = float(task.shard_sizes_gb([t], [dim])[0])
        if not cluster.fits(need):
            how = f"even in column shards of {dim}" if dim < task.dims[t] else "whole"
            weights = size_text(float(table_size_gb(task.rows[t], dim)))
            fixes = (["raise the topology's memory", "add ranks"] + (
                [UVM_FIX] if memory_kind == "HBM" else []) if table.row_block >= 0 or table.replica >= 0 else
                [*_narrower(table, dim), "raise the topology's memory", torchrec_fix(memory_kind)])
            raise NoRoom(f"{table.where} needs {size_text(need)} {how} as TorchRec counts its storage (weights "
                         f"{weights}), more than one rank's {size_text(cluster.max_mem_gb)} of {memory_kind} "
                         f"{reserved}", fixes)


UVM_FIX = ("plan it with TorchRec's EmbeddingShardingPlanner, which can place tables on UVM caching "
           "(NeuroShardPlanner does not price that)")


def torchrec_fix(memory_kind: str) -> str:
    """The fix NeuroShardPlanner cannot make itself: the kernels it does not price."""
    if memory_kind == "HBM":
        return f"allow row_wise in its ParameterConstraints, or {UVM_FIX}"
    return ("allow row_wise in its ParameterConstraints and pass neuroshard.sharding.planner.sharders.RowWiseSharder() "
            "as its sharder (TorchRec's offers row_wise on cuda only)")


def find_ebcs(module, sharders) -> list[tuple[str, object, object]]:
    """(module path, EBC, its sharder) for every EBC a sharder shards, in TorchRec's walk order."""
    from torchrec.distributed.planner.utils import sharder_name
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    if not isinstance(module, nn.Module):
        raise UserError(f"plan() takes the model (a torch.nn.Module), got {type(module).__name__}")
    if not isinstance(sharders, (list, tuple)) or not all(hasattr(s, "module_type") for s in sharders):
        raise UserError("sharders must be a list of TorchRec sharders, e.g. [EmbeddingBagCollectionSharder()]")
    by_type = {sharder_name(s.module_type): s for s in sharders}
    found, unsharded, queue = [], [], [("", module)]
    while queue:
        path, m = queue.pop(0)
        sharder = by_type.get(sharder_name(type(m)))
        if sharder is None:
            if isinstance(m, EmbeddingBagCollection):
                unsharded.append(path or "<root>")
            queue += [(f"{path}.{n}" if path else n, c) for n, c in m.named_children()]
        elif isinstance(m, EmbeddingBagCollection):
            found.append((path, m, sharder))
        else:
            raise UserError(f"module {path or '<root>'!r} is a {type(m).__name__}: NeuroShardPlanner plans "
                            "EmbeddingBagCollections only; drop its sharder from the list (it stays unsharded) "
                            "or plan the model with TorchRec's EmbeddingShardingPlanner")
    if not found:
        hint = (f"the EmbeddingBagCollection(s) at {', '.join(unsharded)} have no sharder: pass "
                "EmbeddingBagCollectionSharder() in sharders" if unsharded else
                "a TorchRec model keeps its tables in torchrec.EmbeddingBagCollection modules")
        raise UserError(f"no EmbeddingBagCollection to plan in the {type(module).__name__}; {hint}")
    return found


class NoRoom(UserError):
    """No plan of NeuroShard's fits the ranks' memory, or a table allows only types its search does not place
    (TorchRec's planner may still place the tables in other ways): why, and the fixes the caller could make."""

    def __init__(self, reason: str, fixes: list[str]):
        self.reason, self.fixes = reason, fixes
        super().__init__(self.line(fixes))

    def line(self, fixes: list[str]) -> str:
        """The reason and `fixes` as one line: 'reason; a, b, or c'."""
        if not fixes:
            return self.reason
        return f"{self.reason}; " + (fixes[0] if len(fixes) == 1 else f"{', '.join(fixes[:-1])}, or {fixes[-1]}")


def _narrower(table: PlannedTable, narrowest: int) -> list[str]:
    """How the caller could let the table be cut narrower than `narrowest` columns, if they can."""
    if not table.splittable:
        return ["allow column_wise sharding of it"]
    if narrowest > 4 and can_split(narrowest):  # min_partition stops the halving
        return [f"lower its min_partition ({table.min_width})"]
    return []


def size_text(gb: float) -> str:
    return f"{gb:.3f} GB" if gb >= 0.1 else f"{round(gb * 2**30):,} bytes"


def _number(x) -> float:
    """A constraint's number as a float; a bool or a string is not one (TypeError)."""
    if isinstance(x, (bool, str, bytes)):
        raise TypeError(x)
    return float(x)


def _names(x: list) -> str:
    return ", ".join(str(n) for n in x[:5]) + (", ..." if len(x) > 5 else "")


def _notes(defaulted: list[str], unpriced: list[str], unknown: list[str], unseen_ids: bool = True) -> list[str]:
    notes = ["note: reuse histograms are the published DLRM dataset's where no ids are given (ids=, or --ids; and row "
             "blocks' lookups spread evenly over their rows)"] if unseen_ids else []
    if defaulted:
        notes.append(f"note: no ParameterConstraints for {len(defaulted)} table(s) ({_names(defaulted)}): pooling "
                     f"factor {DEFAULT_POOLING_FACTOR:g} (TorchRec's default); pass pooling_factors, the cost models "
                     "depend on them")
    if unknown:
        notes.append(f"note: constraints name table(s) no planned EmbeddingBagCollection has, unused: {_names(unknown)}")
    if unpriced:
        notes.append(f"note: the plan carries {_names(unpriced)} as given, but the cost models price fp32 outputs of "
                     "unweighted lookups")
    return notes
