"""The sharding simulator (DESIGN.md §3.4): scores plans with the three cost models, batched.

compute_r = compute model on device r's shards (0 for an empty device); bw_r = backward model on
the dim sums; forward delays d_r = (compute_r + bw_r) - min_r(compute_r + bw_r); fw_r = forward
model on dim sums + delays; cost = max_r (compute_r + bw_r + fw_r). Predicted costs are rounded to
1 ns (`round_ms`) so that mathematically equal costs compare equal whatever the batch shape. A forward
model trained with `--fw_wait_term` adds each rank's wait max_r' d_r' - d_r to its MLP itself
(`CommCostModel`); the simulator is the same for both forms.

The three models must agree (forward and backward direction, device count, hardware, batch) and,
for tasks drawn from a dataset, come from that dataset and batch (`check_dataset`).
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from ..core.errors import UserError
from ..core.types import Cluster, Cost, round_ms
from ..data.features import with_dim
from ..data.tasks import ShardingTask
from .plan import ShardingPlan, fits_memory


class SetCostModel(Protocol):
    """A compute model whose set cost is head(sum of per-table embeddings)."""
    meta: dict

    def embed(self, features: np.ndarray) -> np.ndarray: ...
    def head(self, emb_sum: np.ndarray) -> np.ndarray: ...


class DeviceCostModel(Protocol):
    meta: dict
    num_devices: int

    def predict_np(self, x: np.ndarray) -> np.ndarray: ...


class Simulator:
    def __init__(self, compute: SetCostModel, fw: DeviceCostModel, bw: DeviceCostModel):
        for m, want in ((fw, "fw"), (bw, "bw")):
            got = getattr(m, "direction", want)
            if got != want:
                raise UserError(f"the {want} comm model given is a {got} model; pass the forward model as "
                                "--fw_comm_model and the backward one as --bw_comm_model")
        if fw.num_devices != bw.num_devices:
            raise UserError(f"forward comm model is for {fw.num_devices} devices, backward for {bw.num_devices}; "
                            "train both from one comm_cost_data_<N>.pkl")
        for key, what in (("device", "hardware"), ("batch_size", "batch sizes")):
            vals = {str(m.meta.get(key)) for m in (compute, fw, bw) if m.meta.get(key) is not None}
            if len(vals) > 1:
                raise UserError(f"cost models come from different {what} ({', '.join(sorted(vals))}); "
                                f"collect and train all three with the same {key}")
        if fw.meta.get("mp_keep") != bw.meta.get("mp_keep"):
            raise UserError(f"the forward comm model was trained for mp_keep {fw.meta.get('mp_keep')}, the backward "
                            f"one for {bw.meta.get('mp_keep')}; train both from one comm cost-data file")
        self.compute, self.fw, self.bw = compute, fw, bw
        self.num_devices = fw.num_devices
        self.mp_keep = fw.meta.get("mp_keep")  # DCT-MP's keep fraction the comm models know; None: uncompressed

    @classmethod
    def load(cls, compute_path, fw_path, bw_path, num_devices: int | None = None,
             mp_keep: float | None = None) -> "Simulator":
        """The three models from disk; with `num_devices`, refused unless trained for that many devices;
        refused unless the comm models were trained on the all-to-all of `mp_keep` (None: uncompressed,
        else DCT-MP's keep fraction)."""
        from ..models.cost_models import CommCostModel, ComputeCostModel

        sim = cls(ComputeCostModel.load(compute_path), CommCostModel.load_direction(fw_path, "fw"),
                  CommCostModel.load_direction(bw_path, "bw"))
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
        for name, m in (("compute", self.compute), ("forward comm", self.fw), ("backward comm", self.bw)):
            b = m.meta.get("batch_size")
            if b is not None and int(b) != int(batch_size):
                raise UserError(f"the {name} cost model was trained at batch {b}, this run uses batch {batch_size}; "
                                f"pass --batch_size {b} or retrain the models at batch {batch_size}")

    def check_mp_keep(self, mp_keep: float | None) -> None:
        """Refuse comm models made for another all-to-all (compressed vs uncompressed, or another mp_keep)."""
        if self.mp_keep != mp_keep:
            from ..core.config import mp_text

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

    def total_cost(self, compute: np.ndarray, dim_sums: np.ndarray):
        """Batched plan costs from per-device compute [P, N] and dim sums [P, N]."""
        dim_sums = np.asarray(dim_sums, np.float64)
        bw = self.bw.predict_np(dim_sums)
        ready = compute + bw
        delays = ready - ready.min(axis=1, keepdims=True)
        fw = self.fw.predict_np(np.concatenate([dim_sums, delays], axis=1))
        return round_ms((compute + bw + fw).max(axis=1)), fw, bw  # the order of Cost.per_device_ms

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

    def plan_cost(self, task: ShardingTask, plan: ShardingPlan, cluster: Cluster | None = None) -> Cost | None:
        """Simulated cost of one plan; None if it does not fit the cluster's memory (out of memory)."""
        self.check_devices(plan.num_devices)
        if cluster is not None and not fits_memory(task, plan, cluster):
            return None
        emb = self.compute.embed(with_dim(task.data_features[[s.table for s in plan.shards]],
                                          [s.dim for s in plan.shards]))
        sums = np.zeros((plan.num_devices, emb.shape[1]))
        count = np.zeros(plan.num_devices, dtype=np.int64)
        for i, d in enumerate(plan.device_of):  # placement order, as the search accumulates
            sums[d] = sums[d] + emb[i]
            count[d] += 1
        compute = self.set_cost(sums, count)[None]
        _, fw, bw = self.total_cost(compute, plan.device_dim_sums()[None])
        return Cost(compute_ms=compute[0], fw_ms=fw[0], bw_ms=bw[0])
