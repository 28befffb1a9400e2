"""`NeuroShardPlanner`: TorchRec's planner interface, NeuroShard's search (DESIGN.md §8).

A drop-in for `torchrec.distributed.planner.EmbeddingShardingPlanner` in a training script:

    planner = NeuroShardPlanner(topology=Topology(world_size=4, compute_device="cuda", hbm_cap=...),
                                batch_size=512, constraints={"t0": ParameterConstraints(pooling_factors=[20.0])},
                                compute_model="models/compute.pt", fw_comm_model="models/comm_4_fw.pt",
                                bw_comm_model="models/comm_4_bw.pt")
    model = DistributedModelParallel(model, plan=planner.collective_plan(model, sharders, pg))

`plan(module, sharders)` finds every `EmbeddingBagCollection` in `module` that a given sharder shards
(nested ones too, walked as TorchRec's enumerator walks them, so the module paths are TorchRec's), turns
all their tables into one `ShardingTask` and runs NeuroShard's search on it (`search.neuroshard_search`,
the pre-trained cost models, `SearchParams`); `collective_plan` does so on rank 0 and sends the result to
every rank. Both return a TorchRec `ShardingPlan` built by `torchrec_export.to_torchrec_plan`.

- Tables: rows and dim from each table's weight; the pooling factor is the sum over the table's features
  of `ParameterConstraints.pooling_factors` (times `num_poolings` where given); a table without
  constraints gets TorchRec's default, 1.0 (`POOLING_FACTOR`), and the stats say so. No ids are seen,
  so the reuse histogram is the published DLRM one (`data.table_list`, as for a table list without
  `bin_*` columns). Dims must be multiples of 4 (as FBGEMM's TBE needs).
- Memory: a shard costs rows x cols x 4 bytes (fp32 weights) and nothing else, as for the TorchRec
  baseline (`torchrec_baseline.WeightsOnlyStorage`); each rank's budget is its HBM in the topology
  (its DDR when `compute_device="cpu"`), the smallest rank's where they differ. Nothing is reserved for
  dense parameters or activations: give the topology the memory the embedding tables may use.
- `ParameterConstraints.sharding_types`: NeuroShard places tables whole (`table_wise`) or in column
  halves (`column_wise`); a table that allows only table-wise is never split, one that allows only
  column-wise is handed out column-wise (one block when the search keeps it whole), and one that allows
  neither is refused naming the table. The sharder's own sharding types count as well.
- Compute kernel: `fused` (all weights in device memory, the operator the cost models were measured
  on); a table whose `compute_kernels` exclude it is refused. `min_partition`, caching and the other
  constraints do not change NeuroShard's placement (the stats list any `min_partition` ignored).
- Cost models: loaded once at construction (`Simulator.load`), refused with one line when missing or
  trained for another device count than `topology.world_size`. `batch_size` is per rank, as in
  TorchRec; when `batch_size x world_size` differs from the batch the models were trained at, the stats
  say that the predicted milliseconds are at the models' batch. Default `batch_size`: the models' batch
  divided by the world size.
"""
from __future__ import annotations

import json
import math
import textwrap
import time
from pathlib import Path
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from ..core.config import SearchParams, comm_model_paths
from ..core.errors import PlanError, UserError
from ..core.types import MAX_DEVICE_MEM_GB, Cluster, Cost
from ..data.features import table_size_gb
from ..data.table_list import parse_table_rows
from ..data.tasks import ShardingTask
from .plan import ShardingPlan, can_split, check_complete, fits_memory
from .search import neuroshard_search
from .simulator import Simulator
from .torchrec_export import plan_spec, to_torchrec_plan

if TYPE_CHECKING:  # TorchRec is imported only when a planner is made
    import torch.distributed as dist
    from torch import nn
    from torchrec.distributed.planner import ParameterConstraints, Topology
    from torchrec.distributed.types import ModuleSharder, ShardingPlan as TorchRecShardingPlan

TABLE_WISE, COLUMN_WISE, FUSED = "table_wise", "column_wise", "fused"
DEFAULT_POOLING_FACTOR = 1.0  # TorchRec's torchrec.distributed.planner.constants.POOLING_FACTOR
NOTE_WIDTH = 100  # stats notes wrap at this many characters


@dataclass
class PlannedTable:
    """One table of one EmbeddingBagCollection, as the search sees it."""

    module_path: str
    name: str                 # the table's name in its EBC (TorchRec's parameter name)
    column_wise_only: bool    # table-wise forbidden: hand it out column-wise even when whole
    splittable: bool          # column-wise allowed (by the constraints and the sharder)

    @property
    def qualified_name(self) -> str:
        return f"{self.module_path}.{self.name}" if self.module_path else self.name

    @property
    def where(self) -> str:
        return f"table {self.name!r} of EmbeddingBagCollection {self.module_path or '<root>'!r}"


@dataclass
class PlannerResult:
    """What `plan` decided: the tables and their task, NeuroShard's plan and predicted cost, one spec per EBC."""

    tables: list[PlannedTable]
    task: ShardingTask
    plan: ShardingPlan
    cost: Cost
    sharding_types: list[str]  # per table: table_wise or column_wise, as handed to TorchRec
    specs: dict[str, dict]     # module path -> torchrec_export plan spec
    search_s: float
    notes: list[str]


class NeuroShardPlanner:
    """TorchRec's `EmbeddingShardingPlanner` interface with NeuroShard's search (module docstring)."""

    def __init__(self, topology: "Topology", batch_size: int | None = None,
                 constraints: "dict[str, ParameterConstraints] | None" = None, compute_model=None,
                 fw_comm_model=None, bw_comm_model=None, models_dir="models",
                 search: SearchParams = SearchParams(), debug: bool = True):
        from .torchrec_baseline import _import

        _import()  # one clear line when TorchRec is missing
        world = getattr(topology, "world_size", None)
        if not isinstance(world, int) or world < 1 or not hasattr(topology, "devices"):
            raise UserError("NeuroShardPlanner needs topology=torchrec.distributed.planner.Topology(world_size=N, "
                            f"compute_device=..., hbm_cap=...), got {type(topology).__name__}")
        from torchrec.distributed.planner import ParameterConstraints

        if constraints is not None and not isinstance(constraints, dict):
            raise UserError("constraints must be a dict {table name: ParameterConstraints}, "
                            f"got {type(constraints).__name__}")
        for name, c in (constraints or {}).items():
            if not isinstance(c, ParameterConstraints):
                raise UserError(f"constraints[{name!r}] is a {type(c).__name__}; pass "
                                "torchrec.distributed.planner.ParameterConstraints(pooling_factors=[...], ...)")
        if not isinstance(search, SearchParams):
            raise UserError(f"search must be a neuroshard.core.config.SearchParams, got {type(search).__name__}")
        self.topology, self.constraints, self.search, self.debug = topology, dict(constraints or {}), search, debug
        self.device_type = str(topology.compute_device)
        self.memory_kind = "DDR" if self.device_type == "cpu" else "HBM"
        caps = [int(d.storage.ddr if self.memory_kind == "DDR" else d.storage.hbm) for d in topology.devices]
        if min(caps) <= 0:
            raise UserError(f"the topology gives rank {int(np.argmin(caps))} no {self.memory_kind} for embedding "
                            f"tables; pass Topology(..., {self.memory_kind.lower()}_cap=BYTES)")
        self.mem_cap_gb = min(caps) / 2**30
        if self.mem_cap_gb > MAX_DEVICE_MEM_GB:
            raise UserError(f"the topology gives each rank {self.mem_cap_gb:.3g} GB of {self.memory_kind}, more than "
                            f"{MAX_DEVICE_MEM_GB:g} GB; pass Topology(..., {self.memory_kind.lower()}_cap=BYTES) "
                            f"of at most {int(MAX_DEVICE_MEM_GB * 2**30)} bytes")
        self.cluster = Cluster(world, self.mem_cap_gb)
        fw, bw = comm_model_paths(models_dir, world)
        paths = (Path(compute_model or Path(models_dir) / "compute.pt"), Path(fw_comm_model or fw),
                 Path(bw_comm_model or bw))
        try:
            self.simulator = Simulator.load(*paths, num_devices=world)
        except UserError as e:
            raise UserError(f"NeuroShardPlanner: {e}") from None
        self.model_batch = self.simulator.compute.meta.get("batch_size")
        if batch_size is None:
            batch_size = max(1, int(self.model_batch) // world) if self.model_batch else 512
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise UserError(f"batch_size must be a whole number >= 1 (samples per rank), got {batch_size!r}")
        self.batch_size = batch_size
        self.last_result: PlannerResult | None = None

    # ------------------------------------------------------------------------- TorchRec's interface

    def plan(self, module: "nn.Module", sharders: "list[ModuleSharder]") -> "TorchRecShardingPlan":
        """The plan for every EmbeddingBagCollection of `module` (on this process alone)."""
        found = self._find_ebcs(module, sharders)
        self.last_result = self._search(found)
        if self.debug:
            print(self.stats(self.last_result))
        return self._to_torchrec(self.last_result.specs)

    def collective_plan(self, module: "nn.Module", sharders: "list[ModuleSharder] | None" = None,
                        pg: "dist.ProcessGroup | None" = None) -> "TorchRecShardingPlan":
        """Plan on rank 0 of `pg` (default the world) and give every rank the same plan.

        Rank 0 sends the plan as JSON (no pickle) or its error, so a module the planner refuses is one
        `UserError` on every rank instead of ranks waiting for a plan that never comes."""
        import torch.distributed as dist

        if pg is None:
            if not dist.is_initialized():
                raise UserError("collective_plan needs torch.distributed.init_process_group() first; "
                                "on a single process call plan(module, sharders)")
            pg = dist.group.WORLD
        if sharders is None:
            from torchrec.distributed.sharding_plan import get_default_sharders

            sharders = get_default_sharders()
        if dist.get_world_size(pg) != self.cluster.num_devices:
            raise UserError(f"the process group has {dist.get_world_size(pg)} ranks but the topology "
                            f"{self.cluster.num_devices}; pass Topology(world_size={dist.get_world_size(pg)}, ...)")
        failure = None
        message = None
        if dist.get_rank(pg) == 0:
            try:
                self.last_result = self._search(self._find_ebcs(module, sharders))
                message = {"specs": self.last_result.specs}
                if self.debug:
                    print(self.stats(self.last_result))
            except UserError as e:
                message = {"error": str(e)}
            except Exception as e:  # sent to the other ranks, then raised here as it is
                failure = e
                message = {"error": f"NeuroShardPlanner failed on rank 0 ({type(e).__name__}: {e})"}
        message = _broadcast_json(message, pg)
        if failure is not None:
            raise failure
        if not isinstance(message, dict) or "error" in message or not isinstance(message.get("specs"), dict):
            raise UserError(str(message.get("error") if isinstance(message, dict) else "no plan from rank 0"))
        try:  # every rank checks its own model against the plan; all go on only if all agree
            self._check_module(self._find_ebcs(module, sharders), message["specs"])
            mismatch = None
        except UserError as e:
            mismatch = e
        if not _all_ranks_agree(mismatch is None, pg):
            raise mismatch or UserError("another rank's model differs from rank 0's (EmbeddingBagCollections or their "
                                        "tables); build the same model on every rank before collective_plan")
        return self._to_torchrec(message["specs"])

    # ------------------------------------------------------------------------- steps

    def _find_ebcs(self, module, sharders) -> list[tuple[str, object, object]]:
        """(module path, EBC, its sharder) for every EBC a sharder shards, in TorchRec's walk order."""
        from torchrec.distributed.planner.utils import sharder_name
        from torchrec.modules.embedding_modules import EmbeddingBagCollection

        from torch import nn

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

    def _search(self, found) -> PlannerResult:
        tables, rows, defaulted, ignored = [], [], [], []
        for path, ebc, sharder in found:
            for name, param in sharder.shardable_parameters(ebc).items():
                table, row, default = self._table(path, name, param, sharder)
                tables.append(table)
                rows.append((table.where, row))
                defaulted += [table.qualified_name] if default else []
                ignored += [table.qualified_name] if getattr(self.constraints.get(name), "min_partition", None) else []
        if not rows:
            raise UserError("the module's EmbeddingBagCollections hold no tables; give them EmbeddingBagConfigs")
        tl = parse_table_rows(rows, None, "the module's EmbeddingBagCollections")
        task = tl.task
        for t, table in enumerate(tables):  # the narrowest shard a table can have must fit one rank
            dim = int(task.dims[t])
            while table.splittable and can_split(dim):
                dim //= 2
            if not self.cluster.fits(table_size_gb(task.rows[t], dim)):
                raise UserError(f"{table.where} ({_size(task.sizes_gb()[t])}) does not fit one rank's "
                                f"{_size(self.mem_cap_gb)} of {self.memory_kind}"
                                + (f" even in column shards of {dim}; raise the topology's memory" if table.splittable
                                   else " table-wise; raise the topology's memory, or allow column_wise sharding of it"))
        no_split = frozenset(t for t, table in enumerate(tables) if not table.splittable)
        params, widened = self._thresholds_for(task, tables, no_split)
        t0 = time.perf_counter()
        plan = neuroshard_search(self.simulator, task, self.cluster, params, no_split)
        search_s = time.perf_counter() - t0
        if plan is None:
            raise UserError(f"NeuroShardPlanner found no plan for {_size(task.total_size_gb())} of tables within "
                            f"{self.cluster.num_devices} ranks x {_size(self.mem_cap_gb)} of {self.memory_kind}; "
                            "raise the topology's memory, add ranks, or allow column_wise sharding of large tables")
        check_complete(task, plan)
        if not fits_memory(task, plan, self.cluster) or any(plan.shards[i].table in no_split for i in plan.splits):
            raise PlanError("the search returned a plan over memory or splitting a table-wise-only table")
        spec = plan_spec([t.qualified_name for t in tables], tl.rows, task.dims, plan)
        kinds = [COLUMN_WISE if table.column_wise_only or len(entry["shards"]) > 1 else TABLE_WISE
                 for table, entry in zip(tables, spec["tables"])]
        specs: dict[str, dict] = {}
        for table, entry, kind in zip(tables, spec["tables"], kinds):
            specs.setdefault(table.module_path, {**spec, "tables": []})["tables"].append(
                {**entry, "name": table.name, "sharding_type": kind})
        unknown = sorted(set(self.constraints) - {t.name for t in tables})
        notes = _notes(defaulted, ignored, unknown, self.model_batch, self.batch_size * self.cluster.num_devices)
        measured_on = self.simulator.compute.meta.get("device")
        if measured_on in ("cpu", "cuda") and measured_on != self.device_type:
            notes.append(f"note: the cost models were measured on {measured_on}, this topology is {self.device_type}: "
                         f"predicted ms are for the models' hardware")
        return PlannerResult(tables, task, plan, self.simulator.plan_cost(task, plan), kinds, specs, search_s,
                             notes + ([widened] if widened else []))

    def _thresholds_for(self, task: ShardingTask, tables: list[PlannedTable],
                        no_split: frozenset[int]) -> tuple[SearchParams, str | None]:
        """The search parameters, with the dim-sum thresholds widened just enough for the widest table that
        may not be split: a rank's dim sum is capped at s x total dim / N, so such a table wider than
        1.5 x the mean would fit no rank and the paper's grid would find no plan at all."""
        if not no_split:
            return self.search, None
        t = max(no_split, key=lambda i: task.dims[i])
        need = float(task.dims[t]) * self.cluster.num_devices / float(task.dims.sum())
        lo, hi = self.search.threshold_range
        if need <= hi:
            return self.search, None
        return replace(self.search, threshold_range=(lo, need)), (
            f"note: dim-sum thresholds widened to {lo:g}-{need:.3g} (search setting {lo:g}-{hi:g}) so that "
            f"table-wise-only {tables[t].qualified_name} (dim {int(task.dims[t])}) fits one rank")

    def _check_module(self, found, specs: dict[str, dict]) -> None:
        """This rank's module has the EBCs and tables (names, rows, dims) of the plan made on rank 0."""
        mine = {path: [(n, *map(int, p.shape)) for n, p in sharder.shardable_parameters(ebc).items()]
                for path, ebc, sharder in found}
        theirs = {path: [(t["name"], t["rows"], t["dim"]) for t in spec["tables"]] for path, spec in specs.items()}
        if mine != theirs:
            raise UserError("this rank's model differs from rank 0's (EmbeddingBagCollections or their tables); "
                            "build the same model on every rank before collective_plan")

    def _to_torchrec(self, specs: dict[str, dict]) -> "TorchRecShardingPlan":
        from torchrec.distributed.types import ShardingPlan as TorchRecShardingPlan

        plan = {}
        for path, spec in specs.items():
            plan.update(to_torchrec_plan(spec, path, self.device_type, FUSED,
                                         getattr(self.topology, "local_world_size", None)).plan)
        return TorchRecShardingPlan(plan)

    # ------------------------------------------------------------------------- stats

    def stats(self, result: PlannerResult) -> str:
        """Per-rank and per-table statistics in the spirit of TorchRec's planner stats."""
        plan, cost, task, N = result.plan, result.cost, result.task, self.cluster.num_devices
        mem = plan.device_mem_gb(task)
        per_rank = [[int(s.table) for s in shards] for shards in plan.per_device()]
        cw = {t for t, kind in enumerate(result.sharding_types) if kind == COLUMN_WISE}
        unit, scale = ("GB", 1) if self.mem_cap_gb >= 1 else ("MB", 1024)
        head = ["rank", "tables", "shards TW/CW", f"{self.memory_kind} ({unit})", "compute (ms)", "fw comm (ms)",
                "bw comm (ms)", "total (ms)"]
        body = []
        for r in range(N):
            n_cw = sum(t in cw for t in per_rank[r])
            body.append([f"{r}{' *' if r == cost.critical_device else ''}", str(len(set(per_rank[r]))),
                         f"{len(per_rank[r]) - n_cw}/{n_cw}",
                         f"{mem[r] * scale:.3f} ({100 * mem[r] / self.mem_cap_gb:.0f}%)",
                         *(f"{x:.3f}" for x in (cost.compute_ms[r], cost.fw_ms[r], cost.bw_ms[r],
                                                cost.per_device_ms[r]))])
        tbody = []
        for t, table in enumerate(result.tables):
            pieces = sorted((s.col_start, s.dim, d) for s, d in zip(plan.shards, plan.device_of) if s.table == t)
            tbody.append([table.qualified_name, f"{int(task.rows[t])} x {int(task.dims[t])}",
                          f"{task.pooling_factors[t]:g}", result.sharding_types[t],
                          " ".join(f"{c}:{c + w}@{d}" for c, w, d in pieces)])
        batch = self.model_batch or "?"
        hardware = self.simulator.compute.meta.get("device_name") or self.simulator.compute.meta.get("device") or "?"
        lines = [f"NeuroShard planner: {len(result.specs)} EmbeddingBagCollection(s), {task.num_tables} tables, "
                 f"{len(plan.splits)} column split(s), searched in {result.search_s:.2f} s",
                 f"{N} ranks x {self.mem_cap_gb * scale:.3f} {unit} {self.memory_kind} (weights only, fp32)",
                 f"predicted embedding cost {cost.cost_ms:.3f} ms per step at global batch {batch} on {hardware} "
                 "(* the slowest rank)",
                 "", *_columns(head, body), "",
                 *_columns(["table", "rows x dim", "pooling", "sharding", "columns@rank"], tbody),
                 "", *(part for note in result.notes for part in textwrap.wrap(note, NOTE_WIDTH, subsequent_indent="  "))]
        width = max(map(len, lines)) + 4
        bar = "#" * width
        return "\n".join([bar, *(f"# {line.ljust(width - 4)} #" for line in lines), bar])


def _size(gb: float) -> str:
    return f"{gb:.3f} GB" if gb >= 0.1 else f"{round(gb * 2**30):,} bytes"


def _notes(defaulted: list[str], ignored: list[str], unknown: list[str], model_batch, batch: int) -> list[str]:
    def names(x):
        return ", ".join(x[:5]) + (", ..." if len(x) > 5 else "")

    notes = ["note: reuse histograms are the published DLRM dataset's (the planner sees no ids)"]
    if defaulted:
        notes.append(f"note: no ParameterConstraints for {len(defaulted)} table(s) ({names(defaulted)}): pooling factor "
                     f"{DEFAULT_POOLING_FACTOR:g} (TorchRec's default); pass pooling_factors, the cost models depend "
                     "on them")
    if unknown:
        notes.append(f"note: constraints name table(s) no planned EmbeddingBagCollection has, unused: {names(unknown)}")
    if ignored:
        notes.append(f"note: min_partition ignored for {names(ignored)} (NeuroShard halves columns down to 4)")
    if model_batch and int(model_batch) != batch:
        notes.append(f"note: the cost models were trained at global batch {model_batch}, this run's is {batch} "
                     "(batch_size x world_size): predicted ms are at the models' batch")
    return notes


def _columns(head: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(head)]
    fmt = lambda row: "  ".join(c.ljust(w) if i in (0, len(widths) - 1) else c.rjust(w)  # noqa: E731
                                for i, (c, w) in enumerate(zip(row, widths))).rstrip()
    return [fmt(head), *map(fmt, body)]


def _group_device(pg):
    """Where the group's collectives take tensors: the current GPU for NCCL, else the CPU."""
    import torch
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(pg) == "nccl" else torch.device("cpu")


def _all_ranks_agree(ok: bool, pg) -> bool:
    import torch
    import torch.distributed as dist

    flag = torch.tensor([int(ok)], dtype=torch.int64, device=_group_device(pg))
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=pg)
    return bool(flag.item())


def _broadcast_json(obj, pg):
    """`obj` (JSON-able, on the group's rank 0) on every rank of `pg`: bytes in a tensor, never a pickle."""
    import torch
    import torch.distributed as dist

    device = _group_device(pg)
    data = json.dumps(obj).encode() if dist.get_rank(pg) == 0 else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(size, group=pg, group_src=0)
    buf = torch.zeros(int(size.item()), dtype=torch.uint8, device=device)
    if data:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    dist.broadcast(buf, group=pg, group_src=0)
    try:
        return json.loads(buf.cpu().numpy().tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise UserError("the plan received from rank 0 is damaged; run collective_plan again") from None
