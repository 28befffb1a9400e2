"""The sharding simulator (DESIGN.md §3.4): scores plans with the three cost models, batched.

compute_r = compute model on device r's shards (0 for an empty device); bw_r = backward model on
the dim sums; forward delays d_r = (compute_r + bw_r) - min_r(compute_r + bw_r); fw_r = forward
model on dim sums + delays; cost = max_r (compute_r + bw_r + fw_r). Predicted costs are rounded to
1 ns (`round_ms`) so that mathematically equal costs compare equal whatever the batch shape. A forward
model trained with `--fw_wait_term` adds each rank's wait max_r' d_r' - d_r to its MLP itself
(`CommCostModel`); the simulator is the same for both forms.

**The step cost** (`cost="step"`, DESIGN.md §3.4b): what TorchRec's sharded EmbeddingBagCollection runs in
one training step. Its shards fall into sharding groups: `table_wise` (tables in one piece) and
`column_wise` (tables cut into column blocks); TorchRec runs one set of collectives per group present.
Per group g: the input distribution, TorchRec's all-to-all of the ids and lengths each rank's shards of g read
(rank r receives the global batch's ids of its shards: per sample 2 x pooling + 2 words per shard, an int64
id or length being two 4-byte words), priced by the input-distribution model (`inp`, trained on TorchRec's
own KJTAllToAll, `collect_comm_cost_data.py --input_dist`) on those words; without one, by the backward
model (the all-to-all whose rank r receives B x its width), which misses the fixed part of TorchRec's three
collectives (docs/findings.md); the backward all-to-all of g's dim sums; and the forward
all-to-all of g's dim sums. A device's step is compute + sum_g (input_g + bw_g) + sum_g fw_g, with the
forward delays taken from compute + sum_g (input_g + bw_g) as in the paper's cost; the first group's forward
(table-wise when present) waits for the last-ready rank, and the groups after it start together, so the wait
is paid once. With one group (no column split) the step cost is the paper's cost plus the input distribution; a
column split adds the second group's three collectives. A table TorchRec shards row-wise
(`NeuroShardPlanner`, for a table no rank holds even in its narrowest column shards) is a third group: its row
block r on rank r, priced by the compute model as a table of the block's rows and the block's share of the
lookups (ids spread evenly over the rows) at the global batch; its input distribution is the bucketized ids
(per sample 2 x the block's lookups + 2 words); its output is a reduce-scatter of every rank's partial sums
(B x dim each) and its backward the all-gather of the gradients. A data-parallel table (a small
table `NeuroShardPlanner` replicates) is a fourth group: its replica r on rank r computes rank r's local batch,
in an operator of the rank's replicas alone (TorchRec runs the group's lookups apart), priced as the compute model's
set of every replicated table at the global batch over the ranks (`replica_compute_ms`, the same on every rank) and
added to the rank's other compute; it reads its own ids and keeps its output (no input distribution, no forward
all-to-all), and its gradient is all-reduced (its width: the floats a ring sends per rank, over the batch,
`comm_widths`). DDP runs that all-reduce during the backward (`DistributedModelParallel` wraps the replicas in
it), beside the other groups' backward collectives: a rank's backward collectives cost the larger of the
all-reduce and the sum of the others, not their sum. A table whose constraints allow `table_column_wise` and not `column_wise` runs its column shards in
a fifth group, TorchRec's table-column-wise sharding: on one host the column-wise group's collectives over its own
shards (input distribution, backward and forward all-to-all), priced as that group's. A table whose constraints
allow `grid_shard` and no other row type is a sixth group: on one host TorchRec's grid sharding holds on rank r its
row block r of every column, as row-wise, and runs its collectives apart; priced as the row-wise group's; so is a
`table_row_wise` table's, a seventh group (on one host the blocks of row-wise, in a sharding of their own). The
row-wise and data-parallel groups' collectives are priced by their own measured costs where the models folder has them
(`comm_<N>_collectives.json`, `models/collective_models.py`: the reduce-scatter on the group's dim sum, after the
last-ready rank when it is the first group to synchronise; the all-gather on the same dims; the all-reduce on the
group's width). Without that file the reduce-scatter is priced by the forward comm model as an all-to-all of dim
columns from every rank, and the all-gather and all-reduce by the backward model on the same widths.
`--calibrate_dmp` fits the step to TorchRec's measured steps either way. `Cost.bw_ms` then holds input distribution + backward, `fw_ms` the
forward all-to-alls. The paper's cost (`cost="paper"`) is the default (`PAPER_COST`); a user's planning
defaults to the step cost (`USER_COST`).

**A step fit** (`step_fit`, a `StepFit` made by `--calibrate_dmp`): the step cost's total times its scale plus its
per-step overhead, fitted to TorchRec training steps measured on the user's ranks. It moves every plan's step cost
the same increasing way, so it never reorders plans; it makes the totals (and the relative gains `--min_gain`
judges) those of the measured step. The paper's cost ignores it.

The three models must agree (forward and backward direction, device count, hardware, batch) and,
for tasks drawn from a dataset, come from that dataset and batch (`check_dataset`). Every caller loads them
through `Simulator.from_files` (the files a run's flags name, or a models folder's).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

import numpy as np

from ..core.config import COSTS, PAPER_COST, CostModelFiles, mp_text
from ..core.errors import UserError
from ..core.costs import Cluster, Cost, StepFit, round_ms
from ..data.features import input_words, with_dim
from ..data.tasks import ShardingTask
from ..core.file_names import collective_model_path
from ..models.collective_models import CollectiveModels
from ..models.cost_models import CommCostModel, ComputeCostModel
from ..models.ensemble import member_dirs
from ..models.loading import locate_cost_models
from .plan import Placement, fits_memory


class SetCostModel(Protocol):
    """A compute model whose set cost is head(sum of per-table embeddings)."""
    meta: dict

    def embed(self, features: np.ndarray) -> np.ndarray: ...
    def head(self, emb_sum: np.ndarray) -> np.ndarray: ...


class DeviceCostModel(Protocol):
    meta: dict
    num_devices: int

    def predict_np(self, x: np.ndarray) -> np.ndarray: ...


GROUPS = ("table_wise", "column_wise", "row_wise", "data_parallel", "table_column_wise", "grid_shard", "table_row_wise")
# per group: whether TorchRec moves its input and pooled output by all-to-all (a data-parallel table reads its
# rank's own ids and keeps its output; only its gradient crosses ranks, in an all-reduce)
ALL_TO_ALL = np.array([True, True, True, False, True, True, True])
ROW_GROUPS = (2, 5, 6)  # the groups of row blocks: a reduce-scatter forward, an all-gather backward
REPLICA_GROUP = GROUPS.index("data_parallel")  # the replicas' group: no all-to-all, its gradients all-reduced
APART = 4  # the groups from here are sharding types TorchRec runs apart from the group they cut like (one host)


def own_group(kind: str) -> int:
    """The group of a table of sharding type `kind` where TorchRec runs that type apart (table_column_wise,
    grid_shard, table_row_wise: `ShardingTask.type_group`), else -1."""
    group = GROUPS.index(kind)
    return group if group >= APART else -1


def check_cost(cost: str, name: str = "--cost") -> str:
    """`--cost` / `cost=` (`name`: as the caller's user sets it): one of COSTS."""
    if cost not in COSTS:
        raise UserError(f"{name} must be one of {', '.join(COSTS)}, got {cost!r}")
    return cost


class Simulator:
    def __init__(self, compute: SetCostModel, fw: DeviceCostModel, bw: DeviceCostModel, cost: str = PAPER_COST,
                 step_fit: StepFit | None = None, inp: DeviceCostModel | None = None,
                 members: tuple["Simulator", ...] = (), coll: CollectiveModels | None = None):
        for m, want in ((fw, "fw"), (bw, "bw"), (inp, "input")):
            if m is None:
                continue
            got = getattr(m, "direction", want)
            if got != want:
                raise UserError(f"the {want} comm model given is a {got} model; pass the forward model as "
                                "--fw_comm_model, the backward one as --bw_comm_model and the input-distribution "
                                "one as --input_comm_model")
        if fw.num_devices != bw.num_devices:
            raise UserError(f"forward comm model is for {fw.num_devices} devices, backward for {bw.num_devices}; "
                            "train both from one comm_cost_data_<N>.pkl")
        if inp is not None and inp.num_devices != fw.num_devices:
            raise UserError(f"the input-distribution model is for {inp.num_devices} devices, the comm models for "
                            f"{fw.num_devices}; pass models/comm_{fw.num_devices}_input.pt as --input_comm_model")
        if coll is not None and coll.num_devices != fw.num_devices:
            raise UserError(f"the collectives costs are for {coll.num_devices} devices, the comm models for "
                            f"{fw.num_devices}; use models/comm_{fw.num_devices}_collectives.json")
        models = (compute, fw, bw) + ((inp,) if inp is not None else ()) + ((coll,) if coll is not None else ())
        for key, what in (("device", "hardware"), ("batch_size", "batch sizes")):
            vals = {str(m.meta.get(key)) for m in models if m.meta.get(key) is not None}
            if len(vals) > 1:
                raise UserError(f"cost models come from different {what} ({', '.join(sorted(vals))}); "
                                f"collect and train every model with the same {key}")
        if fw.meta.get("mp_keep") != bw.meta.get("mp_keep"):
            raise UserError(f"the forward comm model was trained for mp_keep {fw.meta.get('mp_keep')}, the backward "
                            f"one for {bw.meta.get('mp_keep')}; train both from one comm cost-data file")
        self.compute, self.fw, self.bw, self.inp, self.coll = compute, fw, bw, inp, coll
        self.cost = check_cost(cost)
        self.step_fit = step_fit
        self.num_devices = fw.num_devices
        self.mp_keep = fw.meta.get("mp_keep")  # DCT-MP's keep fraction the comm models know; None: uncompressed
        # the ensemble members (`models/ensemble.py`), scoring plans the same way (with these collectives' costs,
        # which are not resampled); () without them
        self.members = tuple(m if (m.cost, m.step_fit, m.coll) == (cost, step_fit, coll) else
                             Simulator(m.compute, m.fw, m.bw, cost, step_fit, m.inp, coll=coll) for m in members)

    def _with(self, **changes) -> "Simulator":
        """This simulator with the constructor arguments in `changes` replaced (checked again, as any)."""
        args = {"compute": self.compute, "fw": self.fw, "bw": self.bw, "cost": self.cost, "step_fit": self.step_fit,
                "inp": self.inp, "members": self.members, "coll": self.coll}
        return Simulator(**{**args, **changes})

    def with_cost(self, cost: str) -> "Simulator":
        """This simulator scoring plans by `cost` ("paper" or "step"; module docstring)."""
        return self._with(cost=cost)

    def with_step_fit(self, step_fit: StepFit | None) -> "Simulator":
        """This simulator with `step_fit` (None: without one) for its step cost."""
        return self._with(step_fit=step_fit)

    def with_models(self, compute: SetCostModel | None = None, fw: DeviceCostModel | None = None,
                    bw: DeviceCostModel | None = None) -> "Simulator":
        """This simulator with the compute or forward / backward comm models given replaced (`planning/refine.py`'s
        refits); the members and the rest kept."""
        given = {"compute": compute, "fw": fw, "bw": bw}
        return self._with(**{k: v for k, v in given.items() if v is not None})

    def with_members(self, members: tuple["Simulator", ...]) -> "Simulator":
        """This simulator with these ensemble members (a calibrated simulator keeps its pre-trained models'
        members: `sharding/risk.py` uses their relative spread around its own cost)."""
        return self._with(members=members)

    def with_collectives(self, coll: CollectiveModels | None) -> "Simulator":
        """This simulator pricing the row-wise and data-parallel collectives by `coll` (None: by the all-to-all
        models; module docstring). A calibrated simulator keeps its pre-trained models' collectives."""
        return self._with(coll=coll)

    def input_model_note(self) -> str | None:
        """One line when the step cost prices the input distribution without its own model; else None."""
        if self.cost != "step" or self.inp is not None:
            return None
        return (f"note: no input-distribution model (models/comm_{self.num_devices}_input.pt); the step cost prices "
                "TorchRec's input distribution by the backward comm model, which misses the fixed part of its "
                f"collectives; make one with collect_comm_cost_data.py --input_dist --ndevices {self.num_devices} && "
                f"train_comm_cost_model.py --input_dist --ndevices {self.num_devices}")

    def collectives_note(self, task: ShardingTask) -> str | None:
        """One line when the step cost prices a row-wise or data-parallel group of `task` without the collectives'
        own costs; else None."""
        grouped = any(g is not None and (np.asarray(g) >= 0).any() for g in (task.row_block, task.replica))
        if self.cost != "step" or self.coll is not None or not grouped:
            return None
        N = self.num_devices
        return (f"note: no collectives costs (models/comm_{N}_collectives.json); the step cost prices the row-wise "
                "reduce-scatter and all-gather and the data-parallel all-reduce by the all-to-all models; make them "
                f"with collect_comm_cost_data.py --collectives --ndevices {N} && train_comm_cost_model.py "
                f"--collectives --ndevices {N}")

    @classmethod
    def from_files(cls, models: CostModelFiles | str | os.PathLike, num_devices: int, mp_keep: float | None = None,
                   required: bool = True) -> "Simulator | None":
        """The cost models a run's flags name (`CostModelFiles`) or a models folder holds, for `num_devices` devices
        and DCT-MP's `mp_keep`, with the input-distribution model where there is one (`models.loading`): the one
        entry through which the package loads cost models. None when they are missing and not `required`."""
        found = locate_cost_models(models, num_devices, mp_keep, required)
        if found is None:
            return None
        paths, input_path = found
        coll_path = collective_model_path(paths[2].parent, num_devices)  # beside the backward model, where it is
        sim = cls.load(*paths, num_devices=num_devices, mp_keep=mp_keep, input_path=input_path,
                       coll_path=coll_path if os.path.lexists(coll_path) else None)
        members = []
        for d in member_dirs(paths[0].parent):
            got = locate_cost_models(d, num_devices, mp_keep, required=False)
            if got is None:  # members without models for these devices or this mp_keep: no ensemble here
                return sim
            members.append(cls.load(*got[0], num_devices=num_devices, mp_keep=mp_keep, input_path=got[1]))
            _check_member(sim, members[-1], d)
        return sim.with_members(tuple(members))

    @classmethod
    def load(cls, compute_path, fw_path, bw_path, num_devices: int | None = None,
             mp_keep: float | None = None, input_path=None, coll_path=None) -> "Simulator":
        """The models in exactly these files (no defaults: `from_files` finds a run's); with `num_devices`,
        refused unless trained for that many devices; refused unless the comm models were trained on the
        all-to-all of `mp_keep` (None: uncompressed, else DCT-MP's keep fraction)."""
        coll = None if coll_path is None else CollectiveModels.load(coll_path)
        fw = CommCostModel.load_direction(fw_path, "fw")
        if coll is not None and coll.num_devices != fw.num_devices:
            raise UserError(f"{coll_path} holds collectives costs for {coll.num_devices} devices, the comm models are "
                            f"for {fw.num_devices}; make them with collect_comm_cost_data.py --collectives --ndevices "
                            f"{fw.num_devices} && train_comm_cost_model.py --collectives --ndevices {fw.num_devices}, "
                            "or delete the file")
        sim = cls(ComputeCostModel.load(compute_path), fw, CommCostModel.load_direction(bw_path, "bw"),
                  inp=None if input_path is None else CommCostModel.load_direction(input_path, "input"), coll=coll)
        if num_devices is not None:
            sim.check_devices(num_devices)
        sim.check_mp_keep(mp_keep)
        return sim

    def check_dataset(self, fingerprint: str, batch_size: int) -> None:
        """Refuse models trained on another dataset or batch than the tasks are measured with."""
        got = self.compute.meta.get("dataset_fingerprint")
        if got is not None and got != fingerprint:
            raise UserError("the compute cost model was trained on another dataset (fingerprint "
                            f"{got}, this one {fingerprint}); retrain it on this dataset's cost data")
        for name, m in (("compute", self.compute), ("forward comm", self.fw), ("backward comm", self.bw),
                        ("input-distribution", self.inp)):
            if m is None:
                continue
            b = m.meta.get("batch_size")
            if b is not None and int(b) != int(batch_size):
                raise UserError(f"the {name} cost model was trained at batch {b}, this run uses batch {batch_size}; "
                                f"pass --batch_size {b} or retrain the models at batch {batch_size}")

    def check_mp_keep(self, mp_keep: float | None) -> None:
        """Refuse comm models made for another all-to-all (compressed vs uncompressed, or another mp_keep)."""
        if self.mp_keep != mp_keep:
            fix = "drop --mp_keep" if self.mp_keep is None else f"pass --mp_keep {self.mp_keep:g}"
            raise UserError(f"the comm cost models were trained on the {mp_text(self.mp_keep)} all-to-all, this run "
                            f"is {mp_text(mp_keep)}; {fix}, or train comm models with train_comm_cost_model.py"
                            + ("" if mp_keep is None else f" --mp_keep {mp_keep:g}"))

    def check_devices(self, num_devices: int) -> None:
        if num_devices != self.num_devices:
            raise UserError(f"the comm cost models were trained for {self.num_devices} devices, the task asks for "
                            f"{num_devices}; collect comm data and train models with --ndevices {num_devices}")

    def set_cost(self, emb_sum: np.ndarray, count: np.ndarray) -> np.ndarray:
        """Compute cost of device sets from embedding sums [..., 32] and table counts [...]."""
        return np.where(count > 0, round_ms(self.compute.head(emb_sum)), 0.0)

    def replica_compute_ms(self, emb: np.ndarray, replica: np.ndarray) -> float:
        """The compute a rank's data-parallel replicas add (module docstring), from the shards' embeddings [S, D]
        and their replica ranks [S] (-1: not a replica): every replicated table's set at the global batch, over the
        ranks; 0 without replicas."""
        mine = np.asarray(replica) == 0  # every replicated table has its replica 0 on rank 0
        if not mine.any():
            return 0.0
        whole = self.set_cost(np.asarray(emb)[mine].sum(axis=0)[None], np.array([int(mine.sum())]))[0]
        return float(round_ms(whole / self.num_devices))

    def total_cost(self, compute: np.ndarray, dim_sums: np.ndarray):
        """Batched plan costs from per-device compute [P, N] and dim sums [P, N]."""
        dim_sums = np.asarray(dim_sums, np.float64)
        bw = self.bw.predict_np(dim_sums)
        ready = compute + bw
        delays = ready - ready.min(axis=1, keepdims=True)
        fw = self.fw.predict_np(np.concatenate([dim_sums, delays], axis=1))
        return round_ms((compute + bw + fw).max(axis=1)), fw, bw  # the order of Cost.per_device_ms

    def step_total_cost(self, compute: np.ndarray, dim_sums: np.ndarray, input_sums: np.ndarray):
        """Batched step costs (module docstring) from per-device compute [P, N] and per group dim sums and input
        words [P, G, N] (groups as `GROUPS`); an absent group (no dims anywhere) costs nothing."""
        dims, input_sums = np.asarray(dim_sums, np.float64), np.asarray(input_sums, np.float64)
        used = np.flatnonzero(dims.sum(axis=(0, 2)) > 0)  # groups after the last one present anywhere cost nothing
        G = used[-1] + 1 if len(used) else 1
        dims, input_sums = dims[:, :G], input_sums[:, :G]
        P, G, N = dims.shape
        present = (dims.sum(axis=2) > 0)[..., None]                                   # [P, G, 1]
        a2a = ALL_TO_ALL[:G][None, :, None]                                           # [1, G, 1]
        bw = self.bw.predict_np(dims.reshape(-1, N)).reshape(P, G, N)
        if self.coll is not None:  # the row-wise groups' all-gather, the data-parallel group's all-reduce
            for g, name in ((REPLICA_GROUP, "all_reduce"), *((g, "all_gather") for g in ROW_GROUPS)):
                if g < G:
                    bw[:, g] = self.coll.predict_np(name, dims[:, g])
        inp = (self.inp or self.bw).predict_np(input_sums.reshape(-1, N)).reshape(P, G, N)
        backward = np.where(present, bw, 0.0)                                        # [P, G, N]
        backward_ms = backward.sum(axis=1)                                           # [P, N]
        if REPLICA_GROUP < G:  # the replicas' all-reduce runs beside the other groups' backward collectives
            others = backward_ms - backward[:, REPLICA_GROUP]
            backward_ms = np.maximum(others, backward[:, REPLICA_GROUP])
        before = np.where(present & a2a, inp, 0.0).sum(axis=1) + backward_ms          # [P, N]
        ready = compute + before
        delays = ready - ready.min(axis=1, keepdims=True)
        # the first all-to-all group present waits for the last-ready rank; the groups after it start together
        first = np.argmax((present & a2a)[..., 0], axis=1)                           # [P]
        waits = np.where((np.arange(G)[None, :] == first[:, None])[..., None], delays[:, None, :], 0.0)
        fw = self.fw.predict_np(np.concatenate([dims.reshape(-1, N), waits.reshape(-1, N)], axis=1)).reshape(P, G, N)
        for g in ROW_GROUPS if self.coll is not None else ():  # the row-wise groups' reduce-scatter, after the
            if g < G:                                           # last-ready rank's delay
                rw = waits[:, g]
                fw[:, g] = self.coll.predict_np("reduce_scatter", dims[:, g]) + (rw.max(axis=1, keepdims=True) - rw)
        fw = np.where(present & a2a, fw, 0.0).sum(axis=1)
        per_device = ready + fw  # (compute + bw) + fw, as Cost.per_device_ms adds them
        if self.step_fit is not None:
            per_device = self.step_fit.apply(per_device)
        return round_ms(per_device.max(axis=1)), fw, before

    def comm_coverage_note(self, dim_sums, cost: Cost) -> str | None:
        """One line if a plan's dim sums or straggler waits lie beyond the comm models' training data (the
        models record it as `training_input_max`; None for models saved without it, or inside the data)."""
        N = self.num_devices
        top = self.fw.meta.get("training_input_max")
        if top is None:
            return None
        dims = np.asarray(dim_sums, np.float64)
        ready = np.asarray(cost.compute_ms) + np.asarray(cost.bw_ms)
        wait = float(ready.max() - ready.min())
        dim_top, wait_top = max(top[:N]), max(top[N:])
        over = []
        if dims.max() > 1.05 * dim_top:
            over.append(f"a device's dim sum reaches {dims.max():.0f} (the comm data: at most {dim_top:.0f})")
        if wait > 1.05 * wait_top:
            over.append(f"a straggler wait {wait:.1f} ms (the comm data: at most {wait_top:.1f} ms)")
        if not over:
            return None
        return ("note: this plan lies beyond the comm cost data: " + " and ".join(over) + "; its predicted comm is "
                "extrapolated. Collect comm data that covers it (collect_comm_cost_data.py --T_range 10,60 "
                "--sleep_range 1,100) and retrain, or pass --calibrate")

    def plan_cost(self, task: ShardingTask, plan: Placement, cluster: Cluster | None = None) -> Cost | None:
        """Simulated cost of one plan; None if it does not fit the cluster's memory (out of memory)."""
        self.check_devices(plan.num_devices)
        if cluster is not None and not fits_memory(task, plan, cluster):
            return None
        emb = self.compute.embed(with_dim(task.data_features[[s.table for s in plan.shards]],
                                          [s.dim for s in plan.shards]))
        sums = np.zeros((plan.num_devices, emb.shape[1]))
        count = np.zeros(plan.num_devices, dtype=np.int64)
        replica = task.shard_replicas([s.table for s in plan.shards])
        for i, d in enumerate(plan.device_of):  # placement order, as the search accumulates; replicas apart
            if replica[i] < 0:
                sums[d] = sums[d] + emb[i]
                count[d] += 1
        compute = (self.set_cost(sums, count) + self.replica_compute_ms(emb, replica))[None]
        if self.cost == "step":
            dims, words = plan_group_sums(task, plan, self.compute.meta.get("batch_size"))
            _, fw, bw = self.step_total_cost(compute, dims[None], words[None])
            return Cost(compute_ms=compute[0], fw_ms=fw[0], bw_ms=bw[0], step_fit=self.step_fit)
        else:
            _, fw, bw = self.total_cost(compute, plan.device_dim_sums()[None])
        return Cost(compute_ms=compute[0], fw_ms=fw[0], bw_ms=bw[0])


def _check_member(sim: Simulator, member: Simulator, folder) -> None:
    """Refuse an ensemble member trained on other cost data than the pre-trained models (another dataset,
    batch, hardware or input-distribution model), naming its folder."""
    for key in ("dataset_fingerprint", "batch_size", "device", "device_name"):
        if member.compute.meta.get(key) != sim.compute.meta.get(key) or member.fw.meta.get(key) != sim.fw.meta.get(key):
            raise UserError(f"the ensemble member in {folder} was trained on other cost data than the models beside "
                            f"it (its {key} differs); delete {Path(folder).parent} and train the members again "
                            "(tools/run_pipeline.py, or train_ensemble.py)")
    if (member.inp is None) != (sim.inp is None):
        raise UserError(f"the ensemble member in {folder} {'lacks' if member.inp is None else 'has'} an "
                        f"input-distribution model and the models beside it {'do not' if sim.inp is None else 'do'}; "
                        f"delete {Path(folder).parent} and train the members again")


DEFAULT_BATCH = 4096  # the global batch of the paper's cost data


def plan_group_sums(task: ShardingTask, plan: Placement, batch_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per sharding group (`GROUPS`) and device, the plan's dim sums and input words [G, N]: a split table's shards
    are column-wise, as `torchrec_export` exports them, and so is a whole table that must be; a row block is
    row-wise (`ShardingTask.shard_groups`)."""
    tables = np.array([s.table for s in plan.shards], dtype=np.int64)
    shard_dims = np.array([s.dim for s in plan.shards], np.int64)
    group = task.shard_groups(tables, shard_dims)
    dims, words = group_sums(group[None], np.asarray(plan.device_of, np.int64)[None],
                             comm_widths(task, tables, shard_dims, plan.num_devices, batch_size)[None],
                             input_words(task.pooling_factors)[tables][None], plan.num_devices)
    return dims[0], words[0]


def comm_widths(task: ShardingTask, tables, dims, num_devices: int, batch_size: int | None) -> np.ndarray:
    """Per shard, its width in the comm models' unit (floats per sample of the global batch `batch_size`): its dim,
    and for a replica of a data-parallel table the gradient its rank sends in a ring all-reduce, 2 (N - 1) / N x
    rows x dim floats, over the batch (4,096 where the models do not say)."""
    tables, out = np.asarray(tables, np.int64), np.asarray(dims, np.float64).copy()
    if task.replica is not None:
        dp = np.asarray(task.replica)[tables] >= 0
        out[dp] = allreduce_floats(task.rows[tables[dp]], num_devices) * out[dp] / float(batch_size or DEFAULT_BATCH)
    return out


def allreduce_floats(rows, num_devices: int):
    """Floats per column each rank sends in a ring all-reduce of a gradient of `rows` rows: 2 (N - 1) / N x rows."""
    return 2.0 * (num_devices - 1) / num_devices * np.asarray(rows, np.float64)


def group_sums(group: np.ndarray, device: np.ndarray, dim: np.ndarray, words: np.ndarray,
               num_devices: int) -> tuple[np.ndarray, np.ndarray]:
    """The one grouping of shards into sharding groups, for a plan (`plan_group_sums`) and for the search's batches
    of placements: shards [P, L] with their group (0 table-wise, 1 column-wise, 2 row-wise, 3 data-parallel, 4
    table-column-wise, 5 grid, 6 table-row-wise), device,
    width (`comm_widths`) and input words -> per placement, group and device the width sums and input words
    ([P, G, N] each), added in shard order."""
    P, L = group.shape
    at = (np.repeat(np.arange(P), L), group.ravel(), device.ravel())
    dims = np.zeros((P, len(GROUPS), num_devices))
    out = np.zeros((P, len(GROUPS), num_devices))
    np.add.at(dims, at, dim.ravel())
    np.add.at(out, at, words.ravel())
    return dims, out
