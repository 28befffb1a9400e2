"""The sharding simulator (DESIGN.md §3.4): scores plans with the three cost models, batched.

compute_r = compute model on device r's shards (0 for an empty device); bw_r = backward model on
the dim sums; forward delays d_r = (compute_r + bw_r) - min_r(compute_r + bw_r); fw_r = forward
model on dim sums + delays; cost = max_r (compute_r + bw_r + fw_r). Predicted costs are rounded to
1 ns (`round_ms`) so that mathematically equal costs compare equal whatever the batch shape.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .errors import UserError
from .plan import ShardingPlan, fits_memory
from .tasks import ShardingTask
from .tables import with_dim

DECIMALS = 6


def round_ms(x):
    return np.round(x, DECIMALS)


class SetCostModel(Protocol):
    """A compute model whose set cost is head(sum of per-table embeddings)."""
    meta: dict

    def embed(self, features: np.ndarray) -> np.ndarray: ...
    def head(self, emb_sum: np.ndarray) -> np.ndarray: ...


class DeviceCostModel(Protocol):
    meta: dict
    num_devices: int

    def predict_np(self, x: np.ndarray) -> np.ndarray: ...


@dataclass
class SimulatedCost:
    compute_ms: np.ndarray
    fw_ms: np.ndarray
    bw_ms: np.ndarray
    cost_ms: float


class Simulator:
    def __init__(self, compute: SetCostModel, fw: DeviceCostModel, bw: DeviceCostModel):
        if fw.num_devices != bw.num_devices:
            raise UserError(f"forward comm model is for {fw.num_devices} devices, backward for {bw.num_devices}")
        devs = {m.meta.get("device") for m in (compute, fw, bw)} - {None}
        if len(devs) > 1:
            raise UserError(f"cost models come from different hardware ({', '.join(sorted(devs))}); "
                            "train all three on the same kind of device")
        self.compute, self.fw, self.bw = compute, fw, bw
        self.num_devices = fw.num_devices

    @classmethod
    def load(cls, compute_path, fw_path, bw_path) -> "Simulator":
        from .cost_models import CommCostModel, ComputeCostModel

        return cls(ComputeCostModel.load(compute_path), CommCostModel.load(fw_path), CommCostModel.load(bw_path))

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
        return round_ms((compute + bw + fw).max(axis=1)), fw, bw

    def plan_cost(self, task: ShardingTask, plan: ShardingPlan, max_mem_gb: float | None = None) -> SimulatedCost | None:
        """Simulated cost of one plan; None if it does not fit `max_mem_gb` (out of memory)."""
        self.check_devices(plan.num_devices)
        if max_mem_gb is not None and not fits_memory(task, plan, max_mem_gb):
            return None
        emb = self.compute.embed(with_dim(task.data_features[[s.table for s in plan.shards]],
                                          [s.dim for s in plan.shards]))
        sums = np.zeros((plan.num_devices, emb.shape[1]))
        count = np.zeros(plan.num_devices, dtype=np.int64)
        for i, d in enumerate(plan.device_of):  # placement order, as the search accumulates
            sums[d] = sums[d] + emb[i]
            count[d] += 1
        compute = self.set_cost(sums, count)[None]
        cost, fw, bw = self.total_cost(compute, plan.device_dim_sums()[None])
        return SimulatedCost(compute[0], fw[0], bw[0], float(cost[0]))
