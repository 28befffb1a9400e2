"""`--alg torchrec`: TorchRec's `EmbeddingShardingPlanner`, the planner users run today (DESIGN.md §3.6).

The task's tables are built on the `meta` device (no memory is allocated) with their rows, dims and
pooling factors, and the planner gets the run's real batch size; every table may go table-wise or
column-wise with column blocks down to the narrowest block halving reaches (`min_partition`, 4 for a
power-of-two dim, 12 for dims 12, 24 or 48; TorchRec's default block of 128 would make every table here
table-wise; with 4, TorchRec cuts a dim-12 table into three blocks, which no halving plan holds). The
topology has N devices with `hbm_cap` = our per-device memory, no storage reservation, and the `fused`
kernel only (all weights in device memory, as in our plans; UVM caching would bypass the cap).

Same memory model as every other algorithm: TorchRec's own storage estimator also budgets input and
output buffers (which dominate on small devices: it refused tasks that fill a tenth of the devices),
so the planner runs with `WeightsOnlyStorage` in its place — a shard costs rows x cols x 4 bytes of
device memory, nothing else — next to TorchRec's default performance estimator, which still ranks
the proposals. TorchRec's plan is converted into ours (column shards -> halving splits), so the
simulator and eval.py score it like any other plan. When TorchRec finds no plan, the task is out of
memory.
"""
from __future__ import annotations

import logging


from ..core.errors import PlanError, UserError
from ..core.types import Cluster
from ..data.tasks import ShardingTask
from ..data.features import smallest_shard_dim
from .plan import Placement, plan_from_slices

INSTALL_HINT = ("TorchRec is not installed; install it without replacing torch: "
                "pip install --no-deps torchrec==1.9.2 && pip install -c constraints.txt tensordict "
                "torchmetrics==1.0.3 iopath pyre-extensions typing-inspect lightning-utilities (make setup does this)")


def _import():
    try:
        import torchrec  # noqa: F401
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
        from torchrec.distributed.planner.constants import DEFAULT_PERF_ESTIMATOR
        from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
        from torchrec.distributed.planner.estimator import EmbeddingPerfEstimatorFactory
        from torchrec.distributed.planner.types import Storage
        from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
        from torchrec.distributed.embedding_types import EmbeddingComputeKernel
        from torchrec.distributed.types import ShardingType
        from torchrec.modules.embedding_configs import EmbeddingBagConfig
        from torchrec.modules.embedding_modules import EmbeddingBagCollection
    except Exception as e:
        raise UserError(f"{INSTALL_HINT} ({type(e).__name__}: {str(e).splitlines()[0][:120]})") from None
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    return locals()


def fbytes(max_mem_gb: float) -> int:
    """A device's memory in bytes, with the tolerance every other memory check uses."""
    from ..core.types import MEM_TOL_GB

    return int((max_mem_gb + MEM_TOL_GB) * 2**30)


class WeightsOnlyStorage:
    """A TorchRec storage estimator that counts only a shard's weights (rows x cols x 4 bytes)."""

    def __init__(self, storage_cls):
        self.storage_cls = storage_cls

    def estimate(self, sharding_options, sharder_data_map=None) -> None:
        for option in sharding_options:
            for shard in option.shards:
                rows, cols = shard.size
                shard.storage = self.storage_cls(hbm=int(rows) * int(cols) * 4, ddr=0)


class TorchRecSharder:
    name = "torchrec"

    def __init__(self, batch_size: int = 4096):
        self.tr = _import()
        self.batch_size = batch_size

    def __call__(self, task: ShardingTask, cluster: Cluster) -> Placement | None:
        import torch

        num_devices, max_mem_gb = cluster.num_devices, cluster.max_mem_gb
        tr = self.tr
        ST = tr["ShardingType"]
        configs = [tr["EmbeddingBagConfig"](name=f"t{i}", embedding_dim=int(d), num_embeddings=int(r),
                                            feature_names=[f"f{i}"])
                   for i, (d, r) in enumerate(zip(task.dims, task.rows))]
        ebc = tr["EmbeddingBagCollection"](tables=configs, device=torch.device("meta"))
        constraints = {f"t{i}": tr["ParameterConstraints"](
            sharding_types=[ST.TABLE_WISE.value, ST.COLUMN_WISE.value], min_partition=smallest_shard_dim(d),
            compute_kernels=[tr["EmbeddingComputeKernel"].FUSED.value],
            pooling_factors=[max(float(pf), 1e-3)]) for i, (pf, d) in enumerate(zip(task.pooling_factors, task.dims))}
        topology = tr["Topology"](world_size=num_devices, compute_device="cuda", hbm_cap=fbytes(max_mem_gb),
                                  local_world_size=num_devices)
        estimators = [tr["EmbeddingPerfEstimatorFactory"].create(tr["DEFAULT_PERF_ESTIMATOR"], topology=topology,
                                                                 constraints=constraints),
                      WeightsOnlyStorage(tr["Storage"])]
        enumerator = tr["EmbeddingEnumerator"](topology=topology, batch_size=self.batch_size, constraints=constraints,
                                               estimator=estimators)
        planner = tr["EmbeddingShardingPlanner"](
            topology=topology, batch_size=self.batch_size, constraints=constraints, debug=False,
            enumerator=enumerator, storage_reservation=tr["FixedPercentageStorageReservation"](percentage=0.0))
        try:
            plan = planner.plan(ebc, [tr["EmbeddingBagCollectionSharder"]()])
        except Exception as e:  # TorchRec's PlannerError: no plan within the memory cap
            if "PlannerError" in type(e).__name__ or "insufficient" in str(e).lower():
                return None
            raise
        module_plan = next(iter(plan.plan.values()))
        column_shards: dict[int, list[tuple[int, int, int]]] = {}
        for name, ps in module_plan.items():
            t = int(name[1:])
            if ps.sharding_type == ST.TABLE_WISE.value:
                column_shards[t] = [(0, int(task.dims[t]), int(ps.ranks[0]))]
            elif ps.sharding_type == ST.COLUMN_WISE.value:
                column_shards[t] = sorted((int(m.shard_offsets[1]), int(m.shard_sizes[1]), int(m.placement.rank()))
                                          for m in ps.sharding_spec.shards)
            else:
                raise PlanError(f"TorchRec chose {ps.sharding_type} for table {t}, which the constraints exclude")
        return plan_from_slices(task.dims, num_devices, column_shards)
