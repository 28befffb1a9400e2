"""The enumerator: every table of every `EmbeddingBagCollection` a sharder shards, with the options its
`ParameterConstraints` and sharder allow (TorchRec's `EmbeddingEnumerator` in NeuroShard's terms).

- Tables: rows and dim from each table's weight; the pooling factor is the sum over the table's features
  of `pooling_factors` (times `num_poolings` where given); a table without constraints gets TorchRec's
  default, 1.0 (`POOLING_FACTOR`), and a note says so. No ids are seen, so the reuse histogram is the
  published DLRM one (as for a table list without `bin_*` columns). Dims must be multiples of 4.
- Sharding types: NeuroShard places tables whole (`table_wise`) or in column halves (`column_wise`); a
  table that allows only table-wise is never split, one that allows only column-wise is handed out
  column-wise (one block when the search keeps it whole), one that allows neither is refused. The
  sharder's own sharding types count as well. Kernel: `fused`; a table excluding it is refused.
- Storage: each shard the search can cut is counted as TorchRec counts it (`storage.torchrec_storage`: weights,
  optimizer state, input and output buffers, on the planner's topology and batch); `check_fits` refuses a table
  whose narrowest allowed shard fits no rank's budget, before any search.
"""
from __future__ import annotations

import logging
import math
from dataclasses import replace

import numpy as np
from torch import nn

from ...core.errors import UserError
from ...core.costs import Cluster
from ...data.features import smallest_shard_dim
from ...data.table_list import parse_table_rows
from .storage import planned_constraints, torchrec_storage
from .types import COLUMN_WISE, FUSED, TABLE_WISE, Enumeration, Enumerator, PlannedTable

DEFAULT_POOLING_FACTOR = 1.0  # TorchRec's torchrec.distributed.planner.constants.POOLING_FACTOR
logger = logging.getLogger(__name__)


class EmbeddingBagEnumerator(Enumerator):
    def __init__(self, constraints: dict, device_type: str, topology, batch_size: int, memory_kind: str):
        self.constraints, self.device_type = constraints, device_type
        self.topology, self.batch_size, self.memory_kind = topology, batch_size, memory_kind

    def enumerate(self, module, sharders) -> Enumeration:
        tables, rows, defaulted, ignored = [], [], [], []
        for path, ebc, sharder in find_ebcs(module, sharders):
            for name, param in sharder.shardable_parameters(ebc).items():
                table, row, default = self._table(path, name, param, sharder)
                tables.append(table)
                rows.append((table.where, row))
                defaulted += [table.qualified_name] if default else []
                ignored += [table.qualified_name] if getattr(self.constraints.get(name), "min_partition", None) else []
        if not rows:
            raise UserError("the module's EmbeddingBagCollections hold no tables; give them EmbeddingBagConfigs")
        unknown = sorted(set(self.constraints) - {t.name for t in tables})
        if unknown:  # most likely a misspelt name: its constraints would be lost without a word
            logger.warning("NeuroShardPlanner: constraints name table(s) no planned EmbeddingBagCollection has, "
                           "unused: %s; use the names of the EmbeddingBagConfigs", _names(unknown))
        task = parse_table_rows(rows, None, "the module's EmbeddingBagCollections").task
        task = replace(task, column_wise=np.array([t.column_wise_only for t in tables], bool))  # priced as run
        storage = torchrec_storage(self.topology, self.batch_size, planned_constraints(self.constraints, tables),
                                   module, sharders, tables, task.dims, self.memory_kind)
        task = replace(task, storage=storage)
        return Enumeration(tables, [row for _, row in rows], task,
                           frozenset(t for t, table in enumerate(tables) if not table.splittable),
                           _notes(defaulted, ignored, unknown))

    def _table(self, path: str, name: str, param, sharder) -> tuple[PlannedTable, dict, bool]:
        """The table, its row for the table list, and whether its pooling factor is TorchRec's default."""
        where = PlannedTable(path, name, False, False).where
        c = self.constraints.get(name)
        wanted = getattr(c, "sharding_types", None)
        allowed = {TABLE_WISE, COLUMN_WISE} & set(wanted or [TABLE_WISE, COLUMN_WISE])
        if not allowed:
            raise UserError(f"{where}: its ParameterConstraints.sharding_types {list(wanted)} allow neither {TABLE_WISE} "
                            f"nor {COLUMN_WISE}, the two NeuroShardPlanner places; add one of them")
        allowed &= set(sharder.sharding_types(self.device_type))
        if not allowed:
            raise UserError(f"{where}: its sharder {type(sharder).__name__} offers neither {TABLE_WISE} nor {COLUMN_WISE} "
                            f"on {self.device_type}; pass torchrec's EmbeddingBagCollectionSharder()")
        kernels = getattr(c, "compute_kernels", None)
        if kernels is not None and FUSED not in kernels:
            raise UserError(f"{where}: compute_kernels {list(kernels)} exclude {FUSED!r}, the kernel NeuroShard's cost "
                            f"models measure; allow {FUSED!r} or plan the model with EmbeddingShardingPlanner")
        pooling = DEFAULT_POOLING_FACTOR
        if c is not None:
            factors, counts = getattr(c, "pooling_factors", None), getattr(c, "num_poolings", None)
            try:
                counts = [1.0] * len(factors) if counts is None else [float(x) for x in counts]
                factors = [float(x) for x in factors]
            except (TypeError, ValueError):
                raise UserError(f"{where}: pooling_factors (and num_poolings) must be lists of numbers, got "
                                f"{factors!r}") from None
            if not factors or len(counts) != len(factors) or not all(math.isfinite(x) and x >= 0
                                                                     for x in factors + counts):
                raise UserError(f"{where}: pooling_factors must be finite numbers >= 0 (mean lookups per sample, one per "
                                f"feature; num_poolings the same length), got {factors!r}")
            pooling = sum(f * n for f, n in zip(factors, counts))
        rows, dim = (int(x) for x in param.shape)
        table = PlannedTable(path, name, COLUMN_WISE in allowed and TABLE_WISE not in allowed, COLUMN_WISE in allowed)
        return table, {"name": table.qualified_name, "rows": rows, "dim": dim, "pooling_factor": pooling}, c is None


def check_fits(found: Enumeration, cluster: Cluster, memory_kind: str, reserved: str) -> None:
    """Every table's narrowest allowed shard fits one rank's budget (`reserved`: what the budget is after), else one
    line naming the table, its storage, the budget and what would make it fit."""
    task = found.task
    for t, table in enumerate(found.tables):
        dim = smallest_shard_dim(task.dims[t]) if table.splittable else int(task.dims[t])
        need = float(task.shard_sizes_gb([t], [dim])[0])
        if not cluster.fits(need):
            how = f"even in column shards of {dim}" if table.splittable else "table-wise"
            weights = size_text(float(task.rows[t]) * dim * 4 / 2**30)
            raise UserError(f"{table.where} needs {size_text(need)} {how} as TorchRec counts its storage (weights "
                            f"{weights}), more than one rank's {size_text(cluster.max_mem_gb)} of {memory_kind} "
                            f"{reserved}; " + ("" if table.splittable else "allow column_wise sharding of it, ")
                            + "raise the topology's memory, or plan it with TorchRec's EmbeddingShardingPlanner, which "
                            "can place it row_wise or on UVM caching (NeuroShardPlanner does not price those yet)")


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


def size_text(gb: float) -> str:
    return f"{gb:.3f} GB" if gb >= 0.1 else f"{round(gb * 2**30):,} bytes"


def _names(x: list[str]) -> str:
    return ", ".join(x[:5]) + (", ..." if len(x) > 5 else "")


def _notes(defaulted: list[str], ignored: list[str], unknown: list[str]) -> list[str]:
    notes = ["note: reuse histograms are the published DLRM dataset's (the planner sees no ids)"]
    if defaulted:
        notes.append(f"note: no ParameterConstraints for {len(defaulted)} table(s) ({_names(defaulted)}): pooling "
                     f"factor {DEFAULT_POOLING_FACTOR:g} (TorchRec's default); pass pooling_factors, the cost models "
                     "depend on them")
    if unknown:
        notes.append(f"note: constraints name table(s) no planned EmbeddingBagCollection has, unused: {_names(unknown)}")
    if ignored:
        notes.append(f"note: min_partition ignored for {_names(ignored)} (NeuroShard halves columns down to 4)")
    return notes
