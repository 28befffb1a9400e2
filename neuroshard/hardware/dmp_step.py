"""The engine's TorchRec step (DESIGN.md §3.7): a plan measured as TorchRec's own training step.

`DMPStep` plugs into the measurement engine (`engine.EngineSettings(step=DMPStep)`). Its item is a
`TorchRecItem`: a plan as `torchrec_export.plan_spec` describes it (row-wise tables included) or as
`planner.incumbent.parameter_specs` holds a TorchRec planner's plan (any sharding type), and for each of its
tables the dataset table whose ids it reads. The sharder is `RowWiseSharder` (TorchRec's, with row_wise offered
on cpu too). On first sight of an item every rank builds, together, TorchRec's
`DistributedModelParallel` of an `EmbeddingBagCollection` of those tables, sharded by the exported plan
(`to_torchrec_plan`, fused kernel, the update fused into backward: exact SGD, learning rate 0.01) and kept
for the rounds that follow, or built again every `EngineSettings.rebuild_every` rounds: a build carries an
offset through all its rounds that rounds of one build cannot average out (docs/findings.md). One measurement is `warmup` + `iters` training steps, each a forward of the
sharded collection (input distribution, lookups, pooled all-to-all) and a backward (gradient all-to-all,
fused update), on the same ids every round: rank r feeds samples [r B/W, (r+1) B/W) of the dataset's
first B (the engine's batch B over W ranks), as a training step splits a global batch. Per rank the median
timed step; the item's parts are [step, 0, 0] per rank, so a round's cost (max over ranks of the sum) is
the slowest rank's median step.

Unlike `EmulatedStep`, the ranks run concurrently: it is the step a user's training runs, collectives per
sharding type and input distribution included, on the ranks the user has; where ranks share cores (4
ranks on this project's 2-core machine), their compute contends, as it would in that training.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ..core.costs import implausible_ms
from ..core.errors import UserError
from ..core.intervals import paired_interval
from ..core.optional_deps import require_torchrec
from ..data.dataset import DLRMDataset
from ..sharding.plan import Placement
from ..sharding.torchrec_export import SPEC_KIND, empty_kernels, empty_row_blocks, make_ebc, to_torchrec_plan
from .comm_bench import gather_floats
from .engine import EngineSettings, Step, round_cost
from .launch import quiet_torchrec_logs
from .timing import median_ms

LEARNING_RATE = 0.01
REBUILD_EVERY = 1  # `--measure`, `--calibrate_dmp` and the benchmark build each plan again every round (see above)


@dataclass(frozen=True)
class TorchRecItem:
    """A plan for TorchRec's step: its `plan_spec` (JSON text) and per spec table the dataset table id."""

    spec_json: str
    table_ids: tuple

    @classmethod
    def of(cls, spec: dict, table_ids) -> "TorchRecItem":
        return cls(json.dumps(spec, sort_keys=True), tuple(int(t) for t in table_ids))



class DMPStep(Step):
    """TorchRec's training step of a plan (module docstring). Its item is the plan's spec with the dataset table
    each spec table reads (`TorchRecItem`); its drift reference is a calibration's step-fit plans with the steps
    measured for them (`--calibrate_dmp`), one plan a round (`dmp_drift`)."""

    describes = " as TorchRec training steps (DistributedModelParallel)"
    measured_cost = "step"
    rebuild_every = REBUILD_EVERY

    @classmethod
    def check_available(cls, num_devices: int) -> None:
        require_torchrec()  # one line when TorchRec is missing

    @classmethod
    def check_items(cls, items: list, settings: EngineSettings) -> None:
        if settings.hw.device == "cpu":
            for item in items:
                check_cpu_kernels(json.loads(item.spec_json))

    @classmethod
    def item(cls, task, plan, spec: dict) -> TorchRecItem:
        return TorchRecItem.of(spec, task.table_ids)

    @classmethod
    def reference_items(cls, reference, task, num_devices: int, spec_of) -> list:
        return [cls.item(task, p, spec_of(p)) for p in dmp_reference_plans(reference, task, num_devices)]

    @classmethod
    def drift(cls, reference, ref_rounds: list[np.ndarray], seed: int = 0) -> dict:
        return dmp_drift(reference, ref_rounds, seed)

    def __init__(self, settings: EngineSettings, rank: int, world: int):
        super().__init__(settings, rank, world)
        if settings.batch_size % world:
            raise UserError(f"batch {settings.batch_size} is not divisible by {world} ranks; TorchRec's step splits "
                            "the global batch evenly")
        self.dataset = DLRMDataset.load(settings.dataset_dir)
        self.built: dict[TorchRecItem, tuple] = {}
        self.measured: dict[TorchRecItem, int] = {}

    def _inputs(self, spec: dict, table_ids):
        import torch
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        B, W = self.settings.batch_size, self.world
        lo, hi = self.rank * B // W, (self.rank + 1) * B // W
        values, lengths = [], []
        for t in table_ids:
            ids, offs = self.dataset.table_bags(int(t), B)
            values.append(ids[int(offs[lo]):int(offs[hi])])
            lengths.append((offs[lo + 1:hi + 1] - offs[lo:hi]).to(torch.int64))
        return KeyedJaggedTensor(keys=[t["name"] for t in spec["tables"]], values=torch.cat(values),
                                 lengths=torch.cat(lengths))

    def _build(self, item: TorchRecItem):
        import torch
        import torch.distributed as dist
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from torchrec.distributed.model_parallel import DistributedModelParallel
        from torchrec.distributed.types import ShardingEnv, ShardingPlan as TorchRecShardingPlan

        from ..sharding.planner.sharders import RowWiseSharder

        quiet_torchrec_logs()
        spec, table_ids = empty_blocks_first(json.loads(item.spec_json), item.table_ids)
        device = torch.device(self.settings.hw.device)
        sharder = RowWiseSharder(fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LEARNING_RATE})
        if spec.get("torchrec"):  # a TorchRec planner's plan as `incumbent.parameter_specs` holds it
            module = make_ebc({"kind": SPEC_KIND, "world_size": self.world, "tables": [
                {"name": t["name"], "rows": t["rows"], "dim": t["dim"],
                 "shards": [{"col_offset": 0, "width": t["dim"], "rank": 0}]} for t in spec["tables"]]}, "meta")
        else:
            module = make_ebc(spec, "meta")
        plan = TorchRecShardingPlan({"": module_plan(spec, self.world, device.type)})
        dmp = DistributedModelParallel(module=module, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                       plan=plan, device=device, sharders=[sharder])
        return dmp, self._inputs(spec, table_ids).to(device)

    def _step(self, dmp, kjt) -> None:
        out = dmp(kjt)
        out = out.wait() if hasattr(out, "wait") else out
        out.values().sum().backward()

    def measure(self, item) -> list[list[float]]:
        seen = self.measured.get(item, 0)
        every = self.settings.rebuild_every
        if item not in self.built or (every and seen % every == 0):
            self.built.pop(item, None)  # freed before the next build
            self.built[item] = self._build(item)
        self.measured[item] = seen + 1
        dmp, kjt = self.built[item]
        s = self.settings
        step_ms = median_ms(lambda: self._step(dmp, kjt), s.hw.device, s.warmup, s.iters)
        return gather_floats([step_ms, 0.0, 0.0], s.hw.device)


def empty_blocks_first(spec: dict, table_ids) -> tuple[dict, tuple]:
    """The spec with its tables that leave some rank a row block of no rows (a row-wise table of few rows, as
    TorchRec's row-wise cut leaves one: 6 rows on 4 ranks are blocks of 2, 2, 2 and 0) moved to the front, those
    that leave the most ranks one first, keeping the order otherwise, and the dataset table ids in the same order.
    FBGEMM's CPU backward (`split_embedding_backward_exact_cpu_kernel`) reads past a fused kernel's table sizes when
    its last table holds no rows and then fails at random ("... more than 2B rows"). TorchRec fuses a rank's shards
    of one sharding type in module order, and its cut leaves the empty blocks on the last ranks, so a table empty on
    a rank leaves every rank after it one too: in this order each rank's kernel holds the tables empty there first.
    A kernel of only empty blocks cannot be helped by order (`torchrec_export.empty_kernels`). The plan is the same;
    only the order of the module's tables, and so of the lookups inside a kernel, changes."""
    empty = empty_row_blocks(spec)
    order = sorted(range(len(spec["tables"])), key=lambda i: -empty.get(spec["tables"][i]["name"], 0))
    return ({**spec, "tables": [spec["tables"][i] for i in order]},
            tuple(int(table_ids[i]) for i in order))


def check_cpu_kernels(spec: dict) -> None:
    """One line where a rank would hold a fused kernel of no rows, which FBGEMM's CPU operator cannot run."""
    bad = empty_kernels(spec)
    if bad:
        rank, names = next(iter(bad.items()))
        raise UserError(f"this plan leaves rank {rank} only row blocks of no rows of {', '.join(names[:5])} (fewer rows "
                        "than ranks), which FBGEMM's CPU operator cannot train; place these tables table_wise or "
                        "data_parallel")


def module_plan(spec: dict, world: int, device_type: str):
    """The `EmbeddingModuleShardingPlan` `DMPStep` runs a spec as: a TorchRec planner's plan (`parameter_specs`) as
    it is, an export spec on TorchRec's fused kernel (data-parallel tables on its dense one)."""
    from ..sharding.planner.incumbent import from_parameter_specs

    if spec.get("torchrec"):
        return from_parameter_specs(spec, world)
    return to_torchrec_plan(spec, device_type=device_type, compute_kernel="fused").plan[""]


def same_plan(a: dict, b: dict, world: int, device_type: str = "cpu") -> bool:
    """Whether two specs (`TorchRecItem.spec_json`'s kinds) are one plan as `DMPStep` runs them: per table the same
    sharding type, compute kernel, ranks and shards (offsets, sizes, placement)."""
    def runs(spec: dict) -> dict:
        out = {}
        for name, p in module_plan(spec, world, device_type).items():
            shards = None if p.sharding_spec is None else sorted(
                (tuple(s.shard_offsets), tuple(s.shard_sizes), str(s.placement)) for s in p.sharding_spec.shards)
            out[name] = (p.sharding_type, p.compute_kernel, tuple(p.ranks or ()), shards)
        return out

    return runs(a) == runs(b)


def dmp_reference_plans(reference: dict, task, num_devices: int) -> list:
    """The step-fit plans a calibration measured as TorchRec steps (`measured["dmp"]`), as `Placement`s of `task`
    on `num_devices` ranks; plans that are not these tables' or steps that cannot be true are a damaged calibration
    (one line, before anything is measured)."""
    try:
        plans = [Placement.from_dict(d, task.dims, num_devices) for d in reference["plans"]]
        step_ms = reference["step_ms"]
        why = implausible_ms(np.asarray(step_ms, np.float64), positive=True) if len(step_ms) == len(plans) > 0 \
            else "one measured step per plan"
    except (TypeError, KeyError, ValueError) as e:  # PlanError is a ValueError
        why = str(e)
    if why:
        raise UserError(f"the calibration's TorchRec-step plans are damaged ({why}); calibrate again "
                        "(--calibrate K --calibrate_dmp)")
    return plans


def dmp_drift(reference: dict, ref_rounds: list[np.ndarray], seed: int = 0) -> dict:
    """How much slower (> 1) or faster TorchRec's step measured in the rounds than when calibrating: per round the
    step-fit plan measured in it (plan r mod G) now / then; the geometric mean over rounds with a bootstrap 95%
    interval. Also stored as the compute and the comm drift, the keys an emulated engine's drift record has."""
    then = np.asarray(reference["step_ms"], np.float64)
    per_round = np.array([round_cost(parts) / then[r % len(then)] for r, parts in enumerate(ref_rounds)])
    st = paired_interval(per_round, np.ones_like(per_round), method="bootstrap", seed=seed)
    ratio = {"ratio": st.estimate, "ci_lo": st.lo, "ci_hi": st.hi}
    return {"rounds": len(ref_rounds), "groups": len(then), "step": ratio, "compute": ratio, "comm": ratio}
