"""`NeuroShardPlanner`: TorchRec's planner interface with NeuroShard's search (DESIGN.md §8).

A drop-in for `torchrec.distributed.planner.EmbeddingShardingPlanner` in a training script:

    planner = NeuroShardPlanner(topology=Topology(world_size=4, compute_device="cuda", hbm_cap=...),
                                batch_size=512, constraints={"t0": ParameterConstraints(pooling_factors=[20.0])},
                                models_dir="models")
    model = DistributedModelParallel(model, plan=planner.collective_plan(model, sharders, pg))

As TorchRec's planner, it only composes components (`types.py`), each replaceable by the caller:
`EmbeddingBagEnumerator` (tables and options from `ParameterConstraints`), `BeamSplitProposer` (NeuroShard's
beam over column splits), `GridSearchPartitioner` (the greedy grid search that places each proposal's shards),
`NeuralPerfModel` (the simulator's rating of every complete placement and plan: what ranks the proposals, so
another perf model makes other decisions) and `NeuroShardStats` (per-rank and per-table stats through
`logging`). `__init__` checks its arguments (`inputs.py`) and stores the components; `plan` plans on this
process: enumerate, widen the dim-sum thresholds once where a whole block needs it, propose, compare, rate;
`collective_plan` plans on rank 0 and sends the result to every rank. Both return a TorchRec `ShardingPlan`
built by `torchrec_export.to_torchrec_plan`.

- Sharding types: `table_wise` and `column_wise` (NeuroShard's column halvings; `table_column_wise` where only that
  column type is allowed on a topology of one host: the same blocks in a sharding group of their own), and
  `row_wise` (or, where only it is allowed on a topology of one host, `table_row_wise` or `grid_shard`, which
  TorchRec cuts into the same blocks there, each in a group of its own) for a table no
  rank holds even in its narrowest column shards (or that allows only it): its row blocks, one per rank, are
  pinned to their ranks and the search places the rest around them (`row_wise.py`; on cpu the sharder must offer
  it: `sharders.RowWiseSharder`); under the step cost, `data_parallel` for a small table whose gradient all-reduce
  moves fewer floats than its output's all-to-all (a replica pinned to every rank).
- Memory, as TorchRec counts it (`storage.py`): each shard's storage from TorchRec's own storage estimator
  (weights, optimizer state, input and output buffers) against each rank's HBM (its DDR when
  `compute_device="cpu"`) after the storage reservation TorchRec's planner makes (`storage_reservation=`,
  default TorchRec's `HeuristicalStorageReservation(percentage=0.15)`), the smallest rank's where they differ.
  No plan over that budget is handed out; a table that fits no rank is refused in one line.
- Ids (`ids=`, optional): {table name: a 1-D tensor of the ids the table is looked up with in a batch}. The
  table's reuse histogram is measured from them, and so is each row block's share of the lookups: hot rows make
  the blocks of a row-wise table unequal, which TorchRec's estimator (lookups spread evenly over rows) does not
  see. Without them, the published DLRM histogram and an even spread.
- Cost models: loaded once at construction (`Simulator.from_files`), refused with one line when missing or
  trained for another device count than `topology.world_size`; the stats name the files. `batch_size` is
  per rank, as in TorchRec; when `batch_size x world_size` differs from the batch the models were trained
  at, the stats say that the predicted milliseconds are at the models' batch. Default `batch_size`: the
  models' batch divided by the world size. `simulator=` takes models already loaded, e.g. a calibration
  (`planning.calibration_file.read_calibration(path)`, the pair it returns). The input-distribution model
  (`input_comm_model`, default `models_dir/comm_<N>_input.pt` where it exists) prices TorchRec's input
  distribution in the step cost; without one the stats say that the backward model prices it.
- Cost: `cost="step"` (default) scores plans by the simulated step TorchRec runs (per sharding group the
  input distribution and both all-to-alls, `simulator.py`); `cost="paper"` by the paper's three terms.
- Never slower than TorchRec's planner by its own models: with `compare` (default), the plan the caller's own
  `EmbeddingShardingPlanner` call returns for the module (same topology, batch, reservation and constraints;
  rated in tables cut as it cuts them where its row-wise or replicated tables are not the search's; where the
  models cannot price it, e.g. UVM kernels, the plan TorchRec makes with the sharding types and kernel cut to
  those NeuroShard places: `incumbent.py`) and each greedy heuristic's plan of the same tables are rated too (by
  the perf model), and the plan rated fastest is handed out, unless it is rated less than `min_gain` (default 5%)
  cheaper than TorchRec's plan: then TorchRec's (a gain the models cannot resolve is not worth a change of plan).
  The stats list the scores and say which plan won and why. On Linux with a second CPU free, TorchRec's call runs
  in a forked process from the start of `plan`, beside the enumeration, the search and the heuristics
  (`incumbent.TorchRecCall`); elsewhere, in this process. The plan is the same either way.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist

from ...core.config import MIN_GAIN, USER_COST, SearchParams, check_min_gain
from ...core.errors import PlanError, UserError
from ...core.optional_deps import require_torchrec
from ...core.costs import ImplausibleCost
from ..candidates import INCUMBENT, admissible, against_baselines, baseline_plans, handout_verdict
from ..plan import Placement, check_complete, fits_memory
from ...core.costs import Cluster
from ..search import fitting_thresholds, plan_key
from ..simulator import GROUPS, Simulator
from ..torchrec_export import empty_kernels, empty_row_blocks, plan_spec, to_torchrec_plan
from .enumerators import (PASSED_TO_PLAN, EmbeddingBagEnumerator, NoRoom, check_fits, find_ebcs, size_text,
                          torchrec_fix)
from .incumbent import (TorchRecCall, from_parameter_specs, full_plan_elsewhere, parameter_specs, placement_of,
                        priced_kernels, table_shapes, torchrec_plan)
from .storage import checked_reservation, planned_constraints, reserved_budget
from .estimators import NeuralPerfModel
from .arguments import (ModelArguments, checked_constraints, checked_ids, checked_search, planner_batch_size,
                        planner_simulator, topology_ranks)
from .partitioners import GridSearchPartitioner
from .proposers import BeamSplitProposer
from .stats import NeuroShardStats
from .row_wise import (ROW_WISE_CANDIDATES, ROW_WISE_MIN_GAIN, ROW_WISE_ROUNDS, data_parallel_tables, more_row_wise,
                       needs_row_wise, row_wise_attempts, with_row_blocks)
from .types import FUSED, Compared, Enumeration, Enumerator, Partitioner, PerfModel, PlannerResult, Proposer, Stats

if TYPE_CHECKING:  # TorchRec is imported only when a planner is made
    from torch import nn
    from torchrec.distributed.planner import ParameterConstraints, Topology
    from torchrec.distributed.types import ModuleSharder, ShardingPlan as TorchRecShardingPlan


class NeuroShardPlanner:
    """TorchRec's `EmbeddingShardingPlanner` interface with NeuroShard's search (module docstring)."""

    def __init__(self, topology: "Topology", batch_size: int | None = None,
                 constraints: "dict[str, ParameterConstraints] | None" = None, compute_model=None,
                 fw_comm_model=None, bw_comm_model=None, models_dir="models", input_comm_model=None,
                 search: SearchParams = SearchParams(), debug: bool = True, enumerator: Enumerator | None = None,
                 perf_model: PerfModel | None = None, proposer: Proposer | None = None,
                 partitioner: Partitioner | None = None, stats: Stats | None = None, cost: str = USER_COST,
                 simulator: Simulator | tuple | None = None, compare: bool = True, min_gain: float = MIN_GAIN,
                 storage_reservation=None, ids=None, row_wise_by_cost: bool = True):
        require_torchrec()
        ranks = topology_ranks(topology)
        self.topology, self.cluster = topology, ranks.cluster
        self.device_type, self.memory_kind = ranks.device_type, ranks.memory_kind
        self.constraints = checked_constraints(constraints)
        self.search = checked_search(search)
        models = ModelArguments(models_dir, compute_model, fw_comm_model, bw_comm_model, input_comm_model)
        self.simulator, self.model_paths = planner_simulator(simulator, cost, self.cluster.num_devices, models)
        self.compare, self.debug = compare, debug
        if not isinstance(row_wise_by_cost, bool):
            raise UserError(f"NeuroShardPlanner: row_wise_by_cost= must be True or False, got {row_wise_by_cost!r:.40}")
        self.row_wise_by_cost = row_wise_by_cost
        self.min_gain = check_min_gain(min_gain, "NeuroShardPlanner: min_gain=")
        self.model_batch = self.simulator.compute.meta.get("batch_size")
        self.batch_size = planner_batch_size(batch_size, self.model_batch, self.cluster.num_devices)
        self.storage_reservation = checked_reservation(storage_reservation)
        ids = checked_ids(ids)
        if ids and enumerator is not None:
            raise UserError("ids= reaches NeuroShardPlanner's own enumerator; pass them to yours instead, or no "
                            "enumerator=")
        self.enumerator = enumerator or EmbeddingBagEnumerator(self.constraints, self.device_type, topology,
                                                               self.batch_size, self.memory_kind, ids)
        self.perf_model = perf_model or NeuralPerfModel(self.simulator)
        self.proposer = proposer or BeamSplitProposer(self.simulator)
        self.partitioner = partitioner or GridSearchPartitioner(self.simulator)
        self.stats = stats or NeuroShardStats()
        self.last_result: PlannerResult | None = None

    # ------------------------------------------------------------------------- TorchRec's interface

    def plan(self, module: "nn.Module", sharders: "list[ModuleSharder]") -> "TorchRecShardingPlan":
        """The plan for every EmbeddingBagCollection of `module` (on this process alone)."""
        self.last_result = self._plan(module, sharders)
        if self.debug:
            self.stats.log(self.last_result)
        return self._to_torchrec(self.last_result.specs)

    def collective_plan(self, module: "nn.Module", sharders: "list[ModuleSharder] | None" = None,
                        pg: "dist.ProcessGroup | None" = None) -> "TorchRecShardingPlan":
        """Plan on rank 0 of `pg` (default the world) and give every rank the same plan.

        Rank 0 sends the plan as JSON (no pickle) or its error, so a module the planner refuses is one
        `UserError` on every rank instead of ranks waiting for a plan that never comes."""
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
        specs = self._specs_from_rank0(module, sharders, pg)
        try:  # every rank checks its own model against the plan; all go on only if all agree
            self._check_module(module, sharders, specs)
            mismatch = None
        except UserError as e:
            mismatch = e
        if not _all_ranks_agree(mismatch is None, pg):
            raise mismatch or UserError("another rank's model differs from rank 0's (EmbeddingBagCollections or their "
                                        "tables); build the same model on every rank before collective_plan")
        return self._to_torchrec(specs)

    # ------------------------------------------------------------------------- composition

    def _plan(self, module, sharders) -> PlannerResult:
        """Enumerate the tables, widen the thresholds once, propose (the partitioner places every proposal, the
        perf model rates every placement), compare with TorchRec's and the heuristics' plans, rate the plan handed
        out. A predicted cost that cannot be true (any candidate's or the plan's) is one line naming the models
        that predicted it, and no plan is handed out. Where no plan of NeuroShard's fits (or a table allows only
        types it does not place), TorchRec's planner's plan (every sharding type and kernel allowed) is handed out
        unchanged, or, where it has none either, the one line that says why NeuroShard's does not fit."""
        call = None
        try:  # TorchRec's call runs beside all of this where it can (`TorchRecCall`)
            if self.compare:
                call = TorchRecCall((self.topology, self.batch_size, self.constraints, self.storage_reservation,
                                     module, sharders), self.cluster.num_devices)
            found = self.enumerator.enumerate(module, sharders)
            cluster = Cluster(self.cluster.num_devices, reserved_budget(
                self.storage_reservation, self.topology, self.batch_size, module, sharders, self.constraints,
                self.memory_kind))
            try:
                return self._search(found, cluster, module, sharders, call)
            except NoRoom as e:
                if call is None:
                    raise UserError(e.line(e.fixes)) from None
                theirs = call.result()
                if theirs is None:
                    raise UserError(e.line([f for f in e.fixes if f != torchrec_fix(self.memory_kind)])
                                    + "; TorchRec's EmbeddingShardingPlanner finds no plan either") from None
                return self._torchrec_result(found, cluster, theirs, str(e))
        finally:
            if call is not None:
                call.close()

    def _search(self, found: Enumeration, cluster: Cluster, module, sharders,
                call: TorchRecCall | None) -> PlannerResult:
        self._exported_fits = {}  # `_fits_exported`'s answers in this search, by tables and plan
        given = found
        try:
            found, plan, widened, search_s = self._propose(found, cluster)
            compared = self._best_of(found, plan, cluster, module, sharders, given, call) if call else None
            if compared:  # the plan handed out, in the tables as it cuts them (TorchRec's may cut them otherwise)
                found, plan = compared.found, compared.plan
            self._check_proposed(found, plan, cluster)
            cost = self.perf_model.rate(found.task, plan).check()
        except ImplausibleCost as e:
            raise UserError(e.line(*self._models_words())) from None
        kinds = sharding_types(found, plan)
        meta = self.simulator.compute.meta
        specs = module_specs(found, plan, kinds)
        return PlannerResult(found.tables, found.task, plan, cost, kinds, specs, search_s,
                             self._notes(found, compared.notes if compared else (), widened, cluster)
                             + self._empty_block_note(specs), cluster,
                             self.memory_kind, self.model_batch, meta.get("device_name") or meta.get("device") or "?",
                             incumbent=compared.incumbent if compared else None,
                             chosen=compared.chosen if compared else "neuroshard",
                             torchrec_ms=compared.torchrec_ms if compared else None)

    def _propose(self, found: Enumeration, cluster: Cluster) -> tuple:
        """(the tables as searched, the search's plan or None, the thresholds note, search seconds): the tables no
        rank holds go row-wise (`row_wise.needs_row_wise`), the small ones data-parallel under the step cost
        (`row_wise.data_parallel_tables`); while the search finds no plan within memory as exported (TorchRec's
        equal column blocks can take more than the search's halvings), the largest table that may go row-wise
        and has not is added to them and the search runs again. Where the rule replicates more tables than must be
        (those whose constraints allow only data_parallel), all of that runs again without the rule's replicas, and
        the plan rated cheaper of the two is kept (a replica's gradient all-reduce is a collective of its own, which
        the rule, counting floats, does not weigh). Where the plan found has row-wise tables, more go row-wise where
        the step is rated cheaper (`_more_row_wise_by_cost`)."""
        needed = needs_row_wise(found, cluster.fits)
        N, t0 = cluster.num_devices, time.perf_counter()
        by_rule = data_parallel_tables(found, needed, N, self.batch_size * N, self.simulator.cost == "step")
        only = data_parallel_tables(found, needed, N, self.batch_size * N, by_rule=False)
        first = None  # the first plan found, where none fits once exported
        fitting = []  # per set of replicas, the first plan that fits as exported
        for replica_set in ([by_rule, only] if len(only) < len(by_rule) else [by_rule]):
            for row_wise, replicated in row_wise_attempts(found, needed, [replica_set]):
                searched, plan, widened = self._propose_with(found, cluster, row_wise, replicated)
                if plan is not None and self._fits_exported(searched, plan, cluster):
                    fitting.append((searched, plan, widened, row_wise, replicated))
                    break  # else more row-wise tables may fit (TorchRec's equal column blocks can take more room)
                first = first or ((searched, plan, widened, row_wise, replicated) if plan is not None else None)
        if fitting or first is not None:
            searched, plan, widened, row_wise, replicated = min(
                fitting, key=lambda f: self.perf_model.rate(f[0].task, f[1]).cost_ms) if fitting else first
        if plan is not None and row_wise and self.row_wise_by_cost:
            searched, plan, widened = self._more_row_wise_by_cost(found, cluster, row_wise, replicated,
                                                                  (searched, plan, widened))
        return searched, plan, widened, time.perf_counter() - t0

    def _propose_with(self, found: Enumeration, cluster: Cluster, row_wise: list[int], replicated: list[int]):
        """(the tables as searched, the search's plan or None, the thresholds note) with these tables row-wise and
        these replicated."""
        searched = with_row_blocks(found, row_wise, cluster.num_devices, self.memory_kind, replicated)
        check_fits(searched, cluster, self.memory_kind, self._reserved_words())
        params, widened = fitting_thresholds(searched.task, cluster.num_devices, self.search, searched.no_split,
                                             [t.qualified_name for t in searched.tables])
        return searched, self.proposer.propose(searched.task, cluster, searched.no_split, params, self.partitioner,
                                               self.perf_model), widened

    def _more_row_wise_by_cost(self, found: Enumeration, cluster: Cluster, row_wise: list[int],
                               replicated: list[int], best: tuple):
        """Where tables already go row-wise, more of them by cost: each round tries adding each of the next
        `ROW_WISE_CANDIDATES` tables that may go row-wise (the largest first, replicas left as they are), and all of
        them at once (then no table-wise or column-wise group is left, and its collectives are saved); the one whose
        plan the perf model rates cheapest, by at least `ROW_WISE_MIN_GAIN`, is kept. Until none is, or
        `ROW_WISE_ROUNDS`."""
        def rated(proposal) -> float:
            return float(self.perf_model.rate(proposal[0].task, proposal[1]).cost_ms)

        best_ms = rated(best)
        for _ in range(ROW_WISE_ROUNDS):
            tried, spare = [], [t for t in more_row_wise(found, row_wise) if t not in replicated]
            # one table more, or every one left (no table-wise or column-wise group left: its collectives saved)
            for extra in [[t] for t in spare[:ROW_WISE_CANDIDATES]] + ([spare] if len(spare) > 1 else []):
                more = sorted(row_wise + extra)
                proposal = self._propose_with(found, cluster, more, replicated)
                if proposal[1] is not None and self._fits_exported(proposal[0], proposal[1], cluster):
                    tried.append((rated(proposal), more, proposal))
            cheapest = min(tried, key=lambda x: x[0]) if tried else None
            if cheapest is None or cheapest[0] > best_ms * (1 - ROW_WISE_MIN_GAIN):
                break
            best_ms, row_wise, best = cheapest
        return best

    def _fits_exported(self, found: Enumeration, plan: Placement, cluster: Cluster) -> bool:
        """Whether `plan`, as exported to TorchRec, is within each rank's budget by TorchRec's storage estimator."""
        if found.storage is None:  # a caller's enumerator without a storage counter: its own count stands
            return True
        key = (id(found), tuple(plan.device_of), tuple((s.table, s.col_start, s.dim) for s in plan.shards))
        answers = getattr(self, "_exported_fits", {})  # `_search` starts it anew
        if key not in answers:
            exported = self._to_torchrec(module_specs(found, plan, sharding_types(found, plan)))
            used = found.storage.plan_bytes(exported)[:, 1 if self.memory_kind == "DDR" else 0]
            answers[key] = (found, bool(cluster.fits(used.max() / 2**30)))  # `found` held: its id is not reused
        return answers[key][1]

    def _reserved_words(self) -> str:
        """What the ranks' budget is left after, as the refusals and stats say it."""
        r = self.storage_reservation
        pct = getattr(r, "_percentage", None)
        return f"left after TorchRec's {type(r).__name__}" + (f" ({100 * pct:.3g}%)" if isinstance(pct, float) else "")

    def _torchrec_result(self, found: Enumeration, cluster: Cluster, theirs, why: str) -> PlannerResult:
        """TorchRec's plan, handed out unchanged, and the notes that say why."""
        specs = parameter_specs(theirs, table_shapes(found))
        kinds = {(path, t["name"]): f"{t['sharding_type']} ({t['compute_kernel']})" for path, spec in specs.items()
                 for t in spec["tables"]}
        note = (f"note: handed out TorchRec's EmbeddingShardingPlanner plan unchanged, which NeuroShard's cost models "
                "do not price (table_row_wise and table_column_wise over several hosts, grid_shard and the UVM kernels "
                f"are not in its search): {why}")
        meta = self.simulator.compute.meta
        return PlannerResult(found.tables, found.task, None, None, [kinds[(t.module_path, t.name)] for t in found.tables],
                             specs, 0.0, found.notes + [self._memory_note(cluster), note] + self._empty_block_note(specs),
                             cluster, self.memory_kind,
                             self.model_batch, meta.get("device_name") or meta.get("device") or "?",
                             chosen="torchrec")

    def _check_proposed(self, found: Enumeration, plan: Placement | None, cluster: Cluster) -> None:
        """A plan, complete, within memory (as exported too) and splitting no table-wise-only table."""
        task = found.task
        if plan is None:
            unsplit = ["allow column_wise sharding of large tables"] if found.no_split else []
            raise NoRoom(f"NeuroShardPlanner found no plan for {size_text(task.total_size_gb())} of tables (as "
                         f"TorchRec counts them) within {cluster.num_devices} ranks x {size_text(cluster.max_mem_gb)} "
                         f"of {self.memory_kind} {self._reserved_words()}",
                         ["raise the topology's memory", "add ranks", *unsplit, torchrec_fix(self.memory_kind)])
        check_complete(task, plan)
        if not fits_memory(task, plan, cluster) or any(plan.shards[i].table in found.no_split
                                                       for i in plan.splits):
            raise PlanError("the search returned a plan over memory or splitting a table-wise-only table")
        if not self.compare and not self._fits_exported(found, plan, cluster):  # compare held every candidate to it
            raise NoRoom("NeuroShard's search plan is over a rank's memory once exported (TorchRec runs a split table "
                         "as equal column blocks of its narrowest shard, each with its own input buffers)",
                         ["raise the topology's memory", "leave compare on to consider the other plans"])

    def _best_of(self, found: Enumeration, plan: Placement, cluster: Cluster, module, sharders,
                 given: Enumeration, call: TorchRecCall) -> Compared:
        """The plan handed out (`Compared`) among NeuroShard's, the caller's own
        `EmbeddingShardingPlanner` call's (`_torchrec_compared`) and each greedy heuristic's of the same tables, as
        the perf model rates them (`candidates.best_simulated` with `min_gain`; a plan that splits a table-wise-only
        table or is over a rank's budget is not a candidate). Where TorchRec's plan cuts the tables otherwise than
        the search (other row-wise or data-parallel tables), it is rated in tables cut as it cuts them, and handed
        out unless the fastest other plan is rated at least `min_gain` cheaper."""
        batch = int(self.model_batch or self.batch_size * self.cluster.num_devices)
        ratings: dict[tuple, object] = {}  # by plan

        def rate(task, candidate: Placement):
            key = plan_key(candidate)
            if key not in ratings:
                ratings[key] = self.perf_model.rate(task, candidate)
            return ratings[key]

        def fits(candidate: Placement) -> bool:
            return self._fits_exported(found, candidate, cluster)

        # the heuristics' plans made, rated and counted while TorchRec's call may still run (`TorchRecCall`)
        heuristics = baseline_plans(found.task, cluster, self.simulator, self.search, batch, torchrec=False)
        for _, p in heuristics:  # as `against_baselines` takes them: rated, then counted where they may be candidates
            rate(found.task, p)
            admissible(found.task, p, cluster, found.no_split, fits)
        theirs, missing, elsewhere = self._torchrec_compared(found, given, module, sharders, cluster, call)
        try:
            best, ranked = against_baselines(found.task, cluster, self.simulator, self.search, batch, plan,
                                             no_split=found.no_split, min_gain=self.min_gain, rate=rate,
                                             torchrec_plan=theirs, fits=fits, baselines=heuristics)
        except PlanError:  # neither the search nor TorchRec's planner nor a heuristic found a plan within memory
            if elsewhere is None:
                return Compared(found, None, theirs, None, "neuroshard", [])
            best, ranked = None, []
        notes = [missing] if missing else []
        if plan is not None and not any("neuroshard" in c.names for c in ranked):  # `fits` dropped it
            notes.append("note: NeuroShard's search plan is over a rank's memory once exported (TorchRec runs a split "
                         "table as equal column blocks of its narrowest shard, each with its own input buffers): not a "
                         "candidate")
        rated = ", ".join(f"{'/'.join(c.names)} {c.simulated_ms:.3f}" for c in ranked if c.simulated_ms is not None)
        searched = "" if plan is not None else "NeuroShard's search found no plan within memory; "
        if elsewhere is not None:
            other, placed, other_ms = elsewhere
            rated = ", ".join(x for x in (rated, f"torchrec {other_ms:.3f} (its own row-wise and data-parallel "
                                                 "tables)") if x)
            if best is None or best.simulated_ms is None or best.simulated_ms > (1.0 - self.min_gain) * other_ms:
                why = ("no other plan is within memory" if best is None else
                       f"the fastest other ({'/'.join(best.names)}) is rated "
                       f"{1.0 - best.simulated_ms / other_ms:.1%} cheaper, less than min_gain {self.min_gain:g}"
                       if best.simulated_ms < other_ms else "it is rated fastest")
                return Compared(other, placed, None, other_ms, "torchrec", [
                    f"note: {searched}simulated {self.simulator.cost} cost (ms) of the candidate plans: {rated}; plan "
                    f"handed out: torchrec's, since {why}", *notes])
        torchrec_ms = elsewhere[2] if elsewhere else next((c.simulated_ms for c in ranked if INCUMBENT in c.names),
                                                          None)
        return Compared(found, best.plan, theirs, torchrec_ms, "/".join(best.names), [
            f"note: {searched}simulated {self.simulator.cost} cost (ms) of the candidate plans: {rated}; "
            f"{handout_verdict(best, ranked, self.min_gain, setting='min_gain')}", *notes])

    def _torchrec_compared(self, found: Enumeration, given: Enumeration, module, sharders, cluster: Cluster,
                           call: TorchRecCall) -> tuple:
        """(TorchRec's plan as a placement of the searched tables or None, a note on why there is none or None,
        (its tables, its placement, its rated ms) where it cuts them otherwise or None). TorchRec's plan is the
        caller's own `EmbeddingShardingPlanner` call's (the same topology, batch, reservation and constraints).
        Where the cost models cannot price it (UVM or caching kernels, column shards they do not cut), the plan
        TorchRec's planner makes with the sharding types and kernel cut to those NeuroShard places, its row-wise and
        data-parallel tables NeuroShard's (`storage.planned_constraints`), is compared instead."""
        N = cluster.num_devices
        full = call.result()  # started beside the search (`TorchRecCall`)
        if full is None:
            return None, ("note: TorchRec's EmbeddingShardingPlanner finds no plan of these tables within the same "
                          "memory; the plans are compared without it"), None
        if priced_kernels(full):
            try:
                placed, note = placement_of(full, found, N)
                if placed is not None:
                    return placed, None, None
            except PlanError:  # its row-wise or data-parallel tables are not the search's
                other = full_plan_elsewhere(full, given, N, self.memory_kind)
                if other is not None and fits_memory(other[0].task, other[1], cluster) and \
                        self._fits_exported(other[0], other[1], cluster):
                    return None, None, (*other, float(self.perf_model.rate(other[0].task, other[1]).cost_ms))
        theirs, missing = torchrec_plan(self.topology, self.batch_size, planned_constraints(
            self.constraints, found.tables, decided=True), self.storage_reservation, module, sharders, found)
        return theirs, missing, None

    def _notes(self, found: Enumeration, compared: tuple[str, ...], widened: str | None, cluster: Cluster) -> list[str]:
        """The enumerator's notes, then what the stats say of the memory, the cost models, the comparison, the batch,
        the hardware and the widened thresholds."""
        fit = self.simulator.step_fit if self.simulator.cost == "step" else None
        fitted = "" if fit is None else f", fitted to TorchRec steps (x {fit.scale:.3f} + {fit.overhead_ms:.2f} ms)"
        notes = found.notes + [self._memory_note(cluster), f"note: cost models: {', '.join(str(p) for p in self.model_paths)}; plans scored "
                               f"by the simulated {self.simulator.cost} cost{fitted}"] + list(compared)
        notes += [n for n in [self.simulator.input_model_note(), self.simulator.collectives_note(found.task)] if n]
        batch = self.batch_size * self.cluster.num_devices
        if self.model_batch and int(self.model_batch) != batch:
            notes.append(f"note: the cost models were trained at global batch {self.model_batch}, this run's is {batch} "
                         "(batch_size x world_size): predicted ms are at the models' batch")
        device = self.simulator.compute.meta.get("device")
        if device in ("cpu", "cuda") and device != self.device_type:
            notes.append(f"note: the cost models were measured on {device}, this topology is {self.device_type}: "
                         "predicted ms are for the models' hardware")
        return notes + ([widened] if widened else [])

    def _empty_block_note(self, specs: dict[str, dict]) -> list[str]:
        """On a CPU topology, a line naming the handed-out plan's tables that leave a rank an empty row block, and
        one naming a rank where they are all its blocks of a sharding type (`torchrec_export.empty_kernels`)."""
        if self.device_type != "cpu":
            return []
        names = [n for spec in specs.values() for n in empty_row_blocks(spec)]
        notes = [f"note: {', '.join(names[:5])}{', ...' if len(names) > 5 else ''} leave(s) a rank a row block of no "
                 "rows (fewer rows than TorchRec's row-wise cut fills); FBGEMM's CPU backward fails at random when such "
                 "a table is the last of a rank's fused kernel: list these tables first in the EmbeddingBagCollection, "
                 "those with the fewest rows first"] if names else []
        for spec in specs.values():
            for rank, empty in list(empty_kernels(spec).items())[:1]:
                notes.append(f"note: rank {rank} holds only row blocks of no rows of {', '.join(empty[:5])}, a fused "
                             "kernel FBGEMM's CPU operator cannot run; constrain these tables to table_wise or "
                             "data_parallel to train on CPU")
        return notes

    def _memory_note(self, cluster: Cluster) -> str:
        return (f"note: memory as TorchRec's storage estimator counts it (weights, optimizer state, input and output "
                f"buffers), within each rank's {size_text(cluster.max_mem_gb)} of {self.memory_kind} of "
                f"{size_text(self.cluster.max_mem_gb)} {self._reserved_words()}")

    def _models_words(self) -> tuple[str, str]:
        """(the models that predict, how to fix them) for the line of a predicted cost that cannot be true."""
        if not isinstance(self.model_paths[0], Path):  # a simulator or calibration given
            return (f"NeuroShardPlanner: {self.model_paths[0]}", "pass models that fit these tables (calibrate them "
                    "again with tools/shard_tables.py --calibrate K, or leave simulator= out)")
        return (f"NeuroShardPlanner: the cost models ({', '.join(map(str, self.model_paths))})",
                "retrain them on more cost data, or pass a calibration of these tables "
                "(simulator=planning.calibration_file.read_calibration(path))")

    # ------------------------------------------------------------------------- across ranks

    def _specs_from_rank0(self, module, sharders, pg) -> dict[str, dict]:
        """Rank 0's plan specs on every rank; an error planning on rank 0 is raised on every rank (rank 0 raises
        an unexpected one as it is, after sending its line to the others)."""
        failure = message = None
        if dist.get_rank(pg) == 0:
            try:
                self.last_result = self._plan(module, sharders)
                message = {"specs": self.last_result.specs}
                if self.debug:
                    self.stats.log(self.last_result)
            except UserError as e:
                message = {"error": str(e)}
            except Exception as e:
                failure = e
                message = {"error": f"NeuroShardPlanner failed on rank 0 ({type(e).__name__}: {e})"}
        message = _broadcast_json(message, pg)
        if failure is not None:
            raise failure
        if not isinstance(message, dict) or "error" in message or not isinstance(message.get("specs"), dict):
            raise UserError(str(message.get("error") if isinstance(message, dict) else "no plan from rank 0"))
        return message["specs"]

    def _check_module(self, module, sharders, specs: dict[str, dict]) -> None:
        """This rank's module has the EBCs and tables (names, rows, dims) of the plan made on rank 0."""
        mine = {path: [(n, *map(int, p.shape)) for n, p in sharder.shardable_parameters(ebc).items()]
                for path, ebc, sharder in find_ebcs(module, sharders)}
        try:
            theirs = {path: [(t["name"], t["rows"], t["dim"]) for t in spec["tables"]] for path, spec in specs.items()}
        except (KeyError, TypeError, AttributeError):
            raise UserError("the plan received from rank 0 is damaged; run collective_plan again") from None
        if mine != theirs:
            raise UserError("this rank's model differs from rank 0's (EmbeddingBagCollections or their tables); "
                            "build the same model on every rank before collective_plan")

    def _to_torchrec(self, specs: dict[str, dict]) -> "TorchRecShardingPlan":
        from torchrec.distributed.types import ShardingPlan as TorchRecShardingPlan

        plan = {}
        for path, spec in specs.items():
            if spec.get("torchrec"):
                plan[path] = from_parameter_specs(spec, self.cluster.num_devices)
                continue
            plan.update(to_torchrec_plan(spec, path, self.device_type, FUSED,
                                         getattr(self.topology, "local_world_size", None)).plan)
        for module_plan in plan.values():  # the fields TorchRec's planner copies from the constraints, as given
            for name, ps in module_plan.items():
                c = self.constraints.get(name)
                for field in PASSED_TO_PLAN if c is not None else ():
                    if getattr(c, field, None) is not None:
                        setattr(ps, field, getattr(c, field))
        return TorchRecShardingPlan(plan)


def sharding_types(found: Enumeration, plan: Placement) -> list[str]:
    """Per table (a row block counted as one), the sharding type TorchRec runs it in: its group's
    (`ShardingTask.shard_groups`, the step cost's `GROUPS` are named by them): a split table and a whole one that must
    be are column-wise (or table-column-wise), the rest of the whole ones table-wise."""
    task, shard_tables = found.task, [s.table for s in plan.shards]
    group = np.zeros(len(found.tables), np.int64)
    np.maximum.at(group, shard_tables, task.shard_groups(shard_tables, [s.dim for s in plan.shards]))
    return [GROUPS[g] for g in group]


def module_specs(found: Enumeration, plan: Placement, kinds: list[str]) -> dict[str, dict]:
    """One `torchrec_export` plan spec per EmbeddingBagCollection (by module path), each table under its name in
    its EBC and with its sharding type; the row blocks of a row-wise table are one entry whose shards carry their
    row offsets and rows, the replicas of a data-parallel table one entry with a whole shard on every rank."""
    spec = plan_spec([t.qualified_name for t in found.tables], [r["rows"] for r in found.rows], found.task.dims, plan)
    specs: dict[str, dict] = {}
    for table, entry, kind in zip(found.tables, spec["tables"], kinds):
        tables = specs.setdefault(table.module_path, {**spec, "tables": []})["tables"]
        if table.replica > 0:  # the next replica of the entry its replica 0 began
            tables[-1]["shards"].append(entry["shards"][0])
            continue
        if table.row_block > 0:  # the next block of the entry its block 0 began
            tables[-1]["shards"].append({**entry["shards"][0], "row_offset": tables[-1]["rows"], "rows": entry["rows"]})
            tables[-1]["rows"] += entry["rows"]
            continue
        shards = ([{**entry["shards"][0], "row_offset": 0, "rows": entry["rows"]}] if table.row_block == 0
                  else entry["shards"])
        tables.append({**entry, "name": table.name, "sharding_type": kind, "shards": shards})
    return specs


def _group_device(pg) -> torch.device:
    """Where the group's collectives take tensors: the current GPU for NCCL, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(pg) == "nccl" else torch.device("cpu")


def _all_ranks_agree(ok: bool, pg) -> bool:
    flag = torch.tensor([int(ok)], dtype=torch.int64, device=_group_device(pg))
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=pg)
    return bool(flag.item())


def _broadcast_json(obj, pg):
    """`obj` (JSON-able, on the group's rank 0) on every rank of `pg`: bytes in a tensor, never a pickle."""
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
