"""The plan NeuroShard's must beat: what the user's own `EmbeddingShardingPlanner` call returns for the same
module, topology, batch, storage reservation and constraints, with the sharding types and kernel NeuroShard
places (`storage.planned_constraints`), read back as a `Placement` of the enumerated tables."""
from __future__ import annotations

from ...core.errors import PlanError
from ..plan import Placement, plan_from_slices
from .types import COLUMN_WISE, TABLE_WISE, Enumeration


def torchrec_plan(topology, batch_size: int, constraints: dict, reservation, module, sharders,
                  found: Enumeration) -> tuple[Placement | None, str | None]:
    """(TorchRec's plan, None), or (None, a note saying why there is none to compare with)."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    planner = EmbeddingShardingPlanner(topology=topology, batch_size=batch_size, constraints=constraints,
                                       storage_reservation=reservation, debug=False)
    try:
        plan = planner.plan(module, sharders)
    except Exception as e:  # TorchRec's PlannerError: nothing fits its count of memory
        if "PlannerError" not in type(e).__name__:
            raise
        return None, ("note: TorchRec's EmbeddingShardingPlanner finds no table_wise/column_wise plan of these tables "
                      f"within the same memory ({str(e).splitlines()[0][:160]}); the plans are compared without it")
    index = {(t.module_path, t.name): i for i, t in enumerate(found.tables)}
    slices: dict[int, list[tuple[int, int, int]]] = {}
    for path, module_plan in plan.plan.items():
        for name, ps in module_plan.items():
            t = index.get((path, name))
            if t is None or ps.sharding_type not in (TABLE_WISE, COLUMN_WISE):
                raise PlanError(f"TorchRec's planner placed {path}.{name} {ps.sharding_type}, outside the constraints")
            slices[t] = ([(0, int(found.task.dims[t]), int(ps.ranks[0]))] if ps.sharding_type == TABLE_WISE else
                         [(int(m.shard_offsets[1]), int(m.shard_sizes[1]), int(m.placement.rank()))
                          for m in ps.sharding_spec.shards])
    try:
        return plan_from_slices(found.task.dims, topology.world_size, slices), None
    except PlanError as e:
        return None, (f"note: TorchRec's plan cuts column shards NeuroShard's cost models do not price ({e}); the plans "
                      "are compared without it")
