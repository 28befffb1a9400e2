"""`NeuroShardPlanner`: TorchRec's planner interface with NeuroShard's search (DESIGN.md §8).

A drop-in for `torchrec.distributed.planner.EmbeddingShardingPlanner` in a training script:

    planner = NeuroShardPlanner(topology=Topology(world_size=4, compute_device="cuda", hbm_cap=...),
                                batch_size=512, constraints={"t0": ParameterConstraints(pooling_factors=[20.0])},
                                models_dir="models")
    model = DistributedModelParallel(model, plan=planner.collective_plan(model, sharders, pg))

As TorchRec's planner, it only composes components (`types.py`), each replaceable by the caller:
`EmbeddingBagEnumerator` (tables and options from `ParameterConstraints`), `NeuralPerfModel` (the
simulator's rating of a plan), `BeamSplitProposer` (NeuroShard's beam over column splits),
`GridSearchPartitioner` (the greedy grid search) and `NeuroShardStats` (per-rank and per-table stats
through `logging`). `plan` plans on this process; `collective_plan` plans on rank 0 and sends the result to
every rank. Both return a TorchRec `ShardingPlan` built by `torchrec_export.to_torchrec_plan`.

- Memory: a shard costs rows x cols x 4 bytes (fp32 weights) and nothing else, as for the TorchRec
  baseline; each rank's budget is its HBM in the topology (its DDR when `compute_device="cpu"`), the
  smallest rank's where they differ. Nothing is reserved for dense parameters or activations.
- Cost models: loaded once at construction (`Simulator.load`), refused with one line when missing or
  trained for another device count than `topology.world_size`; the stats name the files. `batch_size` is
  per rank, as in TorchRec; when `batch_size x world_size` differs from the batch the models were trained
  at, the stats say that the predicted milliseconds are at the models' batch. Default `batch_size`: the
  models' batch divided by the world size. `simulator=` takes models already loaded, e.g. a calibration
  (`planning.calibrate.read_calibration(path)`, the pair it returns). The input-distribution model
  (`input_comm_model`, default `models_dir/comm_<N>_input.pt` where it exists) prices TorchRec's input
  distribution in the step cost; without one the stats say that the backward model prices it.
- Cost: `cost="step"` (default) scores plans by the simulated step TorchRec runs (per sharding group the
  input distribution and both all-to-alls, `simulator.py`); `cost="paper"` by the paper's three terms.
- Never slower than TorchRec's planner by its own models: with `compare` (default), TorchRec's own
  `EmbeddingShardingPlanner` plan and each greedy heuristic's plan of the same tables are scored too, and the
  plan the simulator rates fastest is handed out, unless it is rated less than `min_gain` (default 5%) cheaper
  than TorchRec's plan: then TorchRec's (a gain the models cannot resolve is not worth a change of plan). The
  stats list the scores and say which plan won and why.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...core.config import MIN_GAIN, CostModelFiles, SearchParams, check_min_gain, comm_model_paths
from ...core.errors import PlanError, UserError
from ...core.types import MAX_DEVICE_MEM_GB, Cluster, ImplausibleCost
from ...data.tasks import ShardingTask
from ..plan import check_complete, fits_memory
from ..search import fitting_thresholds
from ..simulator import Simulator, check_cost
from ..torchrec_export import plan_spec, to_torchrec_plan
from .enumerators import EmbeddingBagEnumerator, size_text
from .estimators import NeuralPerfModel
from .partitioners import GridSearchPartitioner
from .proposers import BeamSplitProposer
from .stats import NeuroShardStats
from .types import (COLUMN_WISE, FUSED, TABLE_WISE, Enumerator, Partitioner, PerfModel,
                    PlannerResult, Proposer, Stats)

if TYPE_CHECKING:  # TorchRec is imported only when a planner is made
    import torch.distributed as dist
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
                 partitioner: Partitioner | None = None, stats: Stats | None = None, cost: str = "step",
                 simulator: Simulator | tuple | None = None, compare: bool = True, min_gain: float = MIN_GAIN):
        from ..torchrec_baseline import _import

        _import()  # one clear line when TorchRec is missing
        world = getattr(topology, "world_size", None)
        if not hasattr(topology, "devices") or isinstance(world, bool) or not isinstance(world, int):
            raise UserError("NeuroShardPlanner needs topology=torchrec.distributed.planner.Topology(world_size=N, "
                            f"compute_device=..., hbm_cap=...), got {type(topology).__name__}")
        if world < 2:
            raise UserError(f"NeuroShardPlanner plans for 2 or more ranks (its comm models predict an all-to-all), got "
                            f"Topology(world_size={world}); a single rank holds every table and needs no plan")
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
        try:
            search.check()
        except UserError as e:  # its messages name the shard_tables flags; here they are the fields
            raise UserError(f"NeuroShardPlanner: search={search}: {str(e).replace('--', '')}") from None
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
        for name, value in (("compute_model", compute_model), ("fw_comm_model", fw_comm_model),
                            ("bw_comm_model", bw_comm_model), ("input_comm_model", input_comm_model),
                            ("models_dir", models_dir)):
            if value is not None and (not isinstance(value, (str, os.PathLike)) or not str(value).strip()):
                raise UserError(f"NeuroShardPlanner: {name} must be a file path (str or pathlib.Path), got "
                                f"{type(value).__name__} {str(value)[:40]!r}")
        fw, bw = comm_model_paths(models_dir, world)
        self.model_paths = (Path(compute_model or Path(models_dir) / "compute.pt"), Path(fw_comm_model or fw),
                            Path(bw_comm_model or bw))
        try:
            check_cost(cost, "cost=")
            if simulator is not None:  # e.g. calibrated models (planning.calibrate.read_calibration's pair)
                given = "the simulator given"
                if isinstance(simulator, tuple) and len(simulator) == 2 and isinstance(simulator[1], dict):
                    simulator, report = simulator
                    given = f"the calibration given (fingerprint {report.get('fingerprint', '?')})"
                if not isinstance(simulator, Simulator):
                    raise UserError(f"simulator must be a neuroshard Simulator or the (Simulator, report) pair of "
                                    f"planning.calibrate.read_calibration, got {type(simulator).__name__}")
                simulator.check_devices(world)
                self.model_paths = (given,)
            else:
                from ...models.loading import input_model_file

                inp = input_model_file(CostModelFiles(*map(str, self.model_paths), input_comm_model), world)
                simulator = Simulator.load(*self.model_paths, num_devices=world, input_path=inp)
                self.model_paths += (inp,) if inp is not None else ()
            self.simulator = simulator.with_cost(cost)
        except UserError as e:
            raise UserError(f"NeuroShardPlanner: {e}") from None
        self.compare = compare
        self.min_gain = check_min_gain(min_gain, "NeuroShardPlanner: min_gain=")
        self.model_batch = self.simulator.compute.meta.get("batch_size")
        if batch_size is None:
            batch_size = max(1, int(self.model_batch) // world) if self.model_batch else 512
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise UserError(f"batch_size must be a whole number >= 1 (samples per rank), got {batch_size!r}")
        self.batch_size = batch_size
        self.enumerator = enumerator or EmbeddingBagEnumerator(self.constraints, self.device_type, self.cluster,
                                                               self.memory_kind)
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
                self.last_result = self._plan(module, sharders)
                message = {"specs": self.last_result.specs}
                if self.debug:
                    self.stats.log(self.last_result)
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
            self._check_module(module, sharders, message["specs"])
            mismatch = None
        except UserError as e:
            mismatch = e
        if not _all_ranks_agree(mismatch is None, pg):
            raise mismatch or UserError("another rank's model differs from rank 0's (EmbeddingBagCollections or their "
                                        "tables); build the same model on every rank before collective_plan")
        return self._to_torchrec(message["specs"])

    # ------------------------------------------------------------------------- composition

    def _plan(self, module, sharders) -> PlannerResult:
        """`_search`; a predicted cost that cannot be true (any candidate's or the plan's) is one line naming the
        models that predicted it, and no plan is handed out."""
        try:
            return self._search(module, sharders)
        except ImplausibleCost as e:
            raise UserError(e.line(*self._models_words())) from None

    def _models_words(self) -> tuple[str, str]:
        """(the models that predict, how to fix them) for the line of a predicted cost that cannot be true."""
        if not isinstance(self.model_paths[0], Path):  # a simulator or calibration given
            return (f"NeuroShardPlanner: {self.model_paths[0]}", "pass models that fit these tables (calibrate them "
                    "again with tools/shard_tables.py --calibrate K, or leave simulator= out)")
        return (f"NeuroShardPlanner: the cost models ({', '.join(map(str, self.model_paths))})",
                "retrain them on more cost data, or pass a calibration of these tables "
                "(simulator=planning.calibrate.read_calibration(path))")

    def _search(self, module, sharders) -> PlannerResult:
        found = self.enumerator.enumerate(module, sharders)
        tables, task = found.tables, found.task
        params, widened = fitting_thresholds(task, self.cluster.num_devices, self.search, found.no_split,
                                             [t.qualified_name for t in tables])
        t0 = time.perf_counter()
        plan = self.proposer.propose(task, self.cluster, found.no_split, params, self.partitioner)
        search_s = time.perf_counter() - t0
        if plan is None:
            raise UserError(f"NeuroShardPlanner found no plan for {size_text(task.total_size_gb())} of tables within "
                            f"{self.cluster.num_devices} ranks x {size_text(self.mem_cap_gb)} of {self.memory_kind}; "
                            "raise the topology's memory, add ranks, or allow column_wise sharding of large tables")
        check_complete(task, plan)
        if not fits_memory(task, plan, self.cluster) or any(plan.shards[i].table in found.no_split
                                                            for i in plan.splits):
            raise PlanError("the search returned a plan over memory or splitting a table-wise-only table")
        compared = self._best_of(task, plan, found.no_split) if self.compare else None
        if compared:
            plan = compared[0]
        spec = plan_spec([t.qualified_name for t in tables], [r["rows"] for r in found.rows], task.dims, plan)
        shard_tables = [s.table for s in plan.shards]
        column_wise = np.zeros(len(tables), bool)  # the step cost's groups (ShardingTask.column_wise_shards)
        shard_cw = task.column_wise_shards(shard_tables, [s.dim for s in plan.shards]) > 0
        np.logical_or.at(column_wise, shard_tables, shard_cw)
        kinds = [COLUMN_WISE if cw else TABLE_WISE for cw in column_wise]
        specs: dict[str, dict] = {}
        for table, entry, kind in zip(tables, spec["tables"], kinds):
            specs.setdefault(table.module_path, {**spec, "tables": []})["tables"].append(
                {**entry, "name": table.name, "sharding_type": kind})
        meta = self.simulator.compute.meta
        fit = self.simulator.step_fit if self.simulator.cost == "step" else None
        fitted = "" if fit is None else \
            f", fitted to TorchRec steps (x {fit.scale:.3f} + {fit.overhead_ms:.2f} ms)"
        notes = found.notes + [f"note: cost models {', '.join(str(p) for p in self.model_paths)}; plans scored by the "
                               f"simulated {self.simulator.cost} cost{fitted}"] + ([compared[1]] if compared else [])
        notes += [n for n in [self.simulator.input_model_note()] if n]
        batch = self.batch_size * self.cluster.num_devices
        if self.model_batch and int(self.model_batch) != batch:
            notes.append(f"note: the cost models were trained at global batch {self.model_batch}, this run's is {batch} "
                         "(batch_size x world_size): predicted ms are at the models' batch")
        if meta.get("device") in ("cpu", "cuda") and meta.get("device") != self.device_type:
            notes.append(f"note: the cost models were measured on {meta.get('device')}, this topology is "
                         f"{self.device_type}: predicted ms are for the models' hardware")
        return PlannerResult(tables, task, plan, self.perf_model.rate(task, plan).check(), kinds, specs, search_s,
                             notes + ([widened] if widened else []), self.cluster, self.memory_kind,
                             self.model_batch, meta.get("device_name") or meta.get("device") or "?")

    def _best_of(self, task: ShardingTask, plan, no_split: frozenset[int]):
        """(plan, note): the plan handed out among NeuroShard's, TorchRec's own planner's and each greedy heuristic's
        of the same tables (`candidates.best_simulated` with `min_gain`; a plan that splits a table-wise-only table
        is not a candidate)."""
        from ..candidates import against_baselines, handout_verdict

        batch = int(self.model_batch or self.batch_size * self.cluster.num_devices)
        best, ranked = against_baselines(task, self.cluster, self.simulator, self.search, batch, plan,
                                         no_split=no_split, min_gain=self.min_gain)
        rated = ", ".join(f"{'/'.join(c.names)} {c.simulated_ms:.3f}" for c in ranked if c.simulated_ms is not None)
        return best.plan, (f"note: simulated {self.simulator.cost} cost (ms) of the candidate plans: {rated}; "
                           f"{handout_verdict(best, ranked, self.min_gain, setting='min_gain')}")

    def _check_module(self, module, sharders, specs: dict[str, dict]) -> None:
        """This rank's module has the EBCs and tables (names, rows, dims) of the plan made on rank 0."""
        from .enumerators import find_ebcs

        mine = {path: [(n, *map(int, p.shape)) for n, p in sharder.shardable_parameters(ebc).items()]
                for path, ebc, sharder in find_ebcs(module, sharders)}
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
