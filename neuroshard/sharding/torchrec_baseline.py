"""`--alg torchrec`: TorchRec's `EmbeddingShardingPlanner`, the planner users run today (DESIGN.md §3.6).

The task's tables are built on the `meta` device (no memory is allocated) with their rows, dims and
pooling factors, and the planner gets the run's real batch size; every table may go table-wise or
column-wise with column blocks down to the narrowest block halving reaches (`min_partition`, 4 for a
power-of-two dim, 12 for dims 12, 24 or 48; TorchRec's default block of 128 would make every table here
table-wise; with 4, TorchRec cuts a dim-12 table into three blocks, which no halving plan holds). The
topology has N devices with `hbm_cap` = our per-device memory, no storage reservation, and the `fused`
kernel only (all weights in device memory, as in our plans; UVM caching would bypass the cap).

Same memory model as every other algorithm: TorchRec's own storage estimator also budgets input and
output buffers, which dominate on small devices, so the planner runs with `WeightsOnlyStorage` in its
place — a shard costs rows x cols x 4 bytes of device memory, nothing else — next to TorchRec's default
performance estimator, which still ranks the proposals. TorchRec's plan is converted into ours (column shards -> halving splits), so the
simulator and eval.py score it like any other plan. When TorchRec finds no plan, the task is out of
memory.
"""
from __future__ import annotations

import torch

from ..core.errors import PlanError
from ..core.optional_deps import require_torchrec
from ..core.costs import MEM_TOL_GB, Cluster
from ..data.features import smallest_shard_dim
from ..data.tasks import ShardingTask
from .plan import Placement, plan_from_slices


def fbytes(max_mem_gb: float) -> int:
    """A device's memory in bytes, with the tolerance every other memory check uses."""
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
        require_torchrec()
        self.batch_size = batch_size

    def __call__(self, task: ShardingTask, cluster: Cluster) -> Placement | None:
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.modules.embedding_configs import EmbeddingBagConfig
        from torchrec.modules.embedding_modules import EmbeddingBagCollection

        configs = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=int(d), num_embeddings=int(r), feature_names=[f"f{i}"])
                   for i, (d, r) in enumerate(zip(task.dims, task.rows))]
        ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
        try:
            plan = self._planner(task, cluster).plan(ebc, [EmbeddingBagCollectionSharder()])
        except Exception as e:  # TorchRec's PlannerError: no plan within the memory cap
            if "PlannerError" in type(e).__name__ or "insufficient" in str(e).lower():
                return None
            raise
        return to_placement(next(iter(plan.plan.values())), task, cluster.num_devices)

    def _planner(self, task: ShardingTask, cluster: Cluster):
        """TorchRec's planner for the task's tables t0, t1, ... (module docstring)."""
        from torchrec.distributed.embedding_types import EmbeddingComputeKernel
        from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
        from torchrec.distributed.planner.constants import DEFAULT_PERF_ESTIMATOR
        from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
        from torchrec.distributed.planner.estimator import EmbeddingPerfEstimatorFactory
        from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
        from torchrec.distributed.planner.types import Storage
        from torchrec.distributed.types import ShardingType

        constraints = {f"t{i}": ParameterConstraints(
            sharding_types=[ShardingType.TABLE_WISE.value, ShardingType.COLUMN_WISE.value],
            min_partition=smallest_shard_dim(d), compute_kernels=[EmbeddingComputeKernel.FUSED.value],
            pooling_factors=[max(float(pf), 1e-3)]) for i, (pf, d) in enumerate(zip(task.pooling_factors, task.dims))}
        topology = Topology(world_size=cluster.num_devices, compute_device="cuda", hbm_cap=fbytes(cluster.max_mem_gb),
                            local_world_size=cluster.num_devices)
        estimators = [EmbeddingPerfEstimatorFactory.create(DEFAULT_PERF_ESTIMATOR, topology=topology,
                                                           constraints=constraints),
                      WeightsOnlyStorage(Storage)]
        enumerator = EmbeddingEnumerator(topology=topology, batch_size=self.batch_size, constraints=constraints,
                                         estimator=estimators)
        return EmbeddingShardingPlanner(topology=topology, batch_size=self.batch_size, constraints=constraints,
                                        debug=False, enumerator=enumerator,
                                        storage_reservation=FixedPercentageStorageReservation(percentage=0.0))


def to_placement(module_plan, task: ShardingTask, num_devices: int) -> Placement:
    """TorchRec's plan of the tables t0, t1, ... as ours: its column shards reached by halving splits."""
    return shardings_placement(((int(name[1:]), ps) for name, ps in module_plan.items()), task.dims, num_devices)


def shardings_placement(shardings, dims, num_devices: int) -> Placement:
    """TorchRec's `ParameterSharding` of each table ((table index, sharding) pairs; table_wise or column_wise) as
    our plan: its column shards reached by halving splits (`plan_from_slices`; a slice no halving reaches is a
    `PlanError`)."""
    return plan_from_slices(dims, num_devices, sharding_slices(shardings, dims))


def sharding_slices(shardings, dims) -> dict[int, list[tuple[int, int, int]]]:
    """The (col_offset, width, rank) column slices of each table in TorchRec's `ParameterSharding`s ((table index,
    sharding) pairs; table_wise, column_wise or table_column_wise)."""
    from torchrec.distributed.types import ShardingType

    column_shards: dict[int, list[tuple[int, int, int]]] = {}
    for t, ps in shardings:
        if ps.sharding_type == ShardingType.TABLE_WISE.value:
            column_shards[t] = [(0, int(dims[t]), int(ps.ranks[0]))]
        elif ps.sharding_type in (ShardingType.COLUMN_WISE.value, ShardingType.TABLE_COLUMN_WISE.value):
            column_shards[t] = sorted((int(m.shard_offsets[1]), int(m.shard_sizes[1]), int(m.placement.rank()))
                                      for m in ps.sharding_spec.shards)
        else:
            raise PlanError(f"TorchRec chose {ps.sharding_type} for table {t}, which the constraints exclude")
    return column_shards
