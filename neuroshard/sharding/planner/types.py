"""What flows between `NeuroShardPlanner`'s components, and the interface of each (TorchRec's
`planner/types.py` in small): an `Enumerator` turns a TorchRec module into tables and a task, a
`Proposer` chooses column splits and asks a `Partitioner` to place each candidate list of shards, a
`PerfModel` rates every complete placement (so it decides which placement, which split and which plan
win) and the plan handed out, and `Stats` reports the result. `NeuroShardPlanner` only composes them;
each can be replaced by the caller."""
from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np

from ...core.config import SearchParams
from ...core.costs import Cluster, Cost
from ...data.features import halvings
from ...data.tasks import ShardingTask
from ..plan import Placement
from ..search import Placements, ShardTable

TABLE_WISE, COLUMN_WISE, ROW_WISE, DATA_PARALLEL = "table_wise", "column_wise", "row_wise", "data_parallel"
# on a topology of one host, TorchRec cuts a table_row_wise table exactly as a row_wise one (the same blocks on the
# same ranks), run as a sharding of its own: NeuroShard places it so, priced in a group of its own
TABLE_ROW_WISE = "table_row_wise"
# on one host, TorchRec's grid_shard cuts a table into column blocks, each row-wise over the host's ranks: every rank
# holds its rows of every column, as row_wise does; NeuroShard places its row blocks so, priced in a group of their own
GRID_SHARD = "grid_shard"
ROW_WISE_KINDS = (ROW_WISE, TABLE_ROW_WISE, GRID_SHARD)
# on one host, TorchRec cuts a table_column_wise table into the column blocks of a column_wise one, and runs them in a
# sharding group of their own: NeuroShard places its column halvings so, priced in that group
TABLE_COLUMN_WISE = "table_column_wise"
COLUMN_WISE_KINDS = (COLUMN_WISE, TABLE_COLUMN_WISE)
FUSED, DENSE = "fused", "dense"  # the kernels: fused for sharded tables, dense for data-parallel ones (TorchRec's)


@dataclass
class PlannedTable:
    """One table of one EmbeddingBagCollection, as the search sees it."""

    module_path: str
    name: str                 # the table's name in its EBC (TorchRec's parameter name)
    column_wise_only: bool    # table-wise forbidden: hand it out column-wise even when whole
    splittable: bool          # column-wise allowed (by the constraints and the sharder)
    min_width: int = 4        # the narrowest column shard allowed (ParameterConstraints.min_partition)
    row_wise: bool = False    # row-wise allowed (by the constraints and the sharder)
    row_wise_only: bool = False  # neither table-wise nor column-wise allowed: row-wise it is
    row_block: int = -1       # this entry is row block r of a row-wise table, on rank r (`row_wise.py`); -1: whole
    data_parallel: bool = False  # data-parallel allowed (by the constraints, the sharder and the dense kernel)
    data_parallel_only: bool = False  # no other type allowed: data-parallel it is
    unplaced: str = ""        # why the search cannot place it (no type it places is allowed); "": it can
    replica: int = -1         # this entry is rank r's replica of a data-parallel table (`row_wise.py`); -1: not one
    row_wise_type: str = ROW_WISE  # what its row blocks are handed out as: row_wise, else table_row_wise, else
                                   # grid_shard (those two on one host, where allowed and row_wise is not)
    column_wise_type: str = COLUMN_WISE  # what its column shards are handed out as: column_wise, else
                                         # table_column_wise (one host, where only that is allowed)

    def narrowest(self, dim: int) -> int:
        """The narrowest shard of this table (of `dim` columns) the search may cut: the smallest column halving of at
        least `min_width` columns, or the whole table where column-wise is not allowed."""
        if not self.splittable:
            return int(dim)
        return min(w for w in halvings(dim) if w >= self.min_width or w == int(dim))

    @property
    def qualified_name(self) -> str:
        return f"{self.module_path}.{self.name}" if self.module_path else self.name

    @property
    def where(self) -> str:
        block = (f"row block {self.row_block} of " if self.row_block >= 0 else
                 f"replica {self.replica} of " if self.replica >= 0 else "")
        return f"{block}table {self.name!r} of EmbeddingBagCollection {self.module_path or '<root>'!r}"


@dataclass
class Enumeration:
    """The enumerator's output: every table in TorchRec's walk order, its table-list row, the task."""

    tables: list[PlannedTable]
    rows: list[dict]          # name (qualified), rows, dim, pooling_factor: what plan_spec takes (a row block's rows)
    task: ShardingTask
    no_split: frozenset[int]  # tables that stay whole (table-wise only, or min_partition)
    notes: list[str]          # defaulted pooling factors, fields the cost models do not price
    storage: object = None    # a `storage.StorageCounter` of the tables, to count an exported plan; None: none
    ids: dict | None = None   # table index -> a sample of its ids (int64), where the caller gave them (`ids=`)


@dataclass
class PlannerResult:
    """What `plan` decided: the tables and their task, NeuroShard's plan and predicted cost, one spec per EBC,
    and what the statistics show about where it was planned. Where NeuroShard's plans do not fit (or a table allows
    only types it does not place) and TorchRec's planner's does, that plan is handed out unchanged: `plan` and
    `cost` are None and the specs are `incumbent.parameter_specs`."""

    tables: list[PlannedTable]
    task: ShardingTask
    plan: Placement | None
    cost: Cost | None
    sharding_types: list[str]  # per table, as handed to TorchRec
    specs: dict[str, dict]     # module path -> torchrec_export plan spec (or incumbent.parameter_specs)
    search_s: float
    notes: list[str]
    cluster: Cluster
    memory_kind: str           # HBM or DDR
    model_batch: int | None    # the global batch the cost models were trained at
    hardware: str              # what the cost models were measured on
    incumbent: Placement | None = None  # TorchRec's plan of the same sharding types, as compared, where it cuts the
                                        # tables as `plan` does (None: none, or it cuts them otherwise)
    torchrec_ms: float | None = None    # TorchRec's plan's rated cost, as compared (None: none compared)
    chosen: str = "neuroshard"  # whose plan `plan` is, as the comparison names it ("neuroshard", "torchrec",
                                # "size_greedy/torchrec", ...); "torchrec" where TorchRec's is handed out unchanged


@dataclass
class Compared:
    """What `NeuroShardPlanner`'s comparison hands out: the tables as that plan cuts them (TorchRec's plan may cut
    them otherwise than the search), the plan (None: none within memory), TorchRec's plan compared in the search's
    tables (None: none, or it cuts them otherwise), TorchRec's rated cost, the names of the plan handed out and the
    comparison's notes."""

    found: Enumeration
    plan: Placement | None
    incumbent: Placement | None
    torchrec_ms: float | None
    chosen: str
    notes: list[str]


class Enumerator(abc.ABC):
    @abc.abstractmethod
    def enumerate(self, module, sharders) -> Enumeration:
        """The tables of every EmbeddingBagCollection a sharder shards, with their options."""


class PerfModel(abc.ABC):
    @abc.abstractmethod
    def rate(self, task: ShardingTask, plan: Placement) -> Cost:
        """The plan's predicted cost per rank."""

    @abc.abstractmethod
    def rate_placements(self, shards: ShardTable, placements: Placements) -> np.ndarray:
        """The predicted cost (ms) of each complete placement [P]: what the partitioner and proposer rank by."""


class Partitioner(abc.ABC):
    @abc.abstractmethod
    def partition(self, shards: ShardTable, states: list[list[tuple[int, int]]], cluster: Cluster,
                  params: SearchParams, perf_model: PerfModel) -> tuple[np.ndarray, np.ndarray]:
        """Best placement of each shard list (all of one length) as `perf_model` rates them: costs [E] (inf: none
        fits), ranks [E, L]."""


class Proposer(abc.ABC):
    @abc.abstractmethod
    def propose(self, task: ShardingTask, cluster: Cluster, no_split: frozenset[int], params: SearchParams,
                partitioner: Partitioner, perf_model: PerfModel) -> Placement | None:
        """The best plan over the column splits it tries, each placed by `partitioner` and rated by `perf_model`;
        None if none fits."""


class Stats(abc.ABC):
    @abc.abstractmethod
    def log(self, result: PlannerResult) -> None:
        """Report the plan (TorchRec's planner logs its stats through `logging`)."""
