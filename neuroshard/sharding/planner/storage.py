"""Memory as TorchRec counts it (`torchrec/distributed/planner/storage_reservations.py` and
`shard_estimators.EmbeddingStorageEstimator`), for `NeuroShardPlanner`:

- `reserved_budget`: each rank's budget after the topology's storage reservation, the one TorchRec's
  `EmbeddingShardingPlanner` makes (by default `HeuristicalStorageReservation(percentage=0.15)`: 15% of HBM, the
  dense model's parameters x 6 and the input KJTs), the smallest rank's where they differ.
- `StorageCounter`: TorchRec's own enumerator and storage estimator on the planner's topology, batch and
  constraints, which count weights, optimizer state where the sharder's fused parameters or the table's optimizer
  ask for it, and the input and output buffers. `halvings` gives the storage of every shard the search can cut
  (each table whole, and its column halvings); `plan_bytes` counts a TorchRec plan as exported (a split table in
  equal column blocks, each with its own buffers). Nothing is re-derived here: the sharding options TorchRec
  enumerates for the table are given the shards as theirs and estimated again. A width the table may not take
  (table-wise only, or narrower than its `min_partition`) is infinite: it fits no rank.
"""
from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np

from ...core.errors import UserError
from ...data.features import halvings
from ...data.tasks import ShardStorage
from .types import DATA_PARALLEL, DENSE, FUSED, TABLE_WISE, PlannedTable

DEFAULT_RESERVATION = 0.15  # TorchRec's EmbeddingShardingPlanner(heuristical_storage_reservation_percentage=)


def default_reservation():
    """The storage reservation `EmbeddingShardingPlanner` makes when given none."""
    import warnings

    from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation

    with warnings.catch_warnings():  # TorchRec's own default warns that it is a heuristic; so is the planner's
        warnings.simplefilter("ignore", FutureWarning)
        return HeuristicalStorageReservation(percentage=DEFAULT_RESERVATION)


def checked_reservation(reservation):
    """The caller's `storage_reservation=` (None: TorchRec's default), refused in one line unless it reserves."""
    if reservation is None:
        return default_reservation()
    if isinstance(reservation, type) or not callable(getattr(reservation, "reserve", None)):
        raise UserError(f"storage_reservation must be a TorchRec StorageReservation (e.g. torchrec.distributed.planner."
                        f"storage_reservations.HeuristicalStorageReservation(percentage=0.15), an instance), got "
                        f"{reservation.__name__ if isinstance(reservation, type) else type(reservation).__name__}"
                        + (" (a class)" if isinstance(reservation, type) else ""))
    return reservation


def memory_field(memory_kind: str) -> str:
    return "ddr" if memory_kind == "DDR" else "hbm"


def reserved_budget(reservation, topology, batch_size: int, module, sharders, constraints: dict,
                    memory_kind: str) -> float:
    """The smallest rank's `memory_kind` (GB) left for embedding tables after `reservation`, called as TorchRec's
    planner calls it; a reservation that fails, returns no topology of the same ranks, or leaves a rank more than it
    has or nothing at all is one `UserError`."""
    name, field = type(reservation).__name__, memory_field(memory_kind)
    try:
        reserved = reservation.reserve(topology=topology, batch_size=batch_size, module=module, sharders=sharders,
                                       constraints=constraints)
    except Exception as e:
        if "PlannerError" not in type(e).__name__:  # TorchRec's own: the reservation is more than a rank has
            raise UserError(f"storage_reservation {name}.reserve(topology=..., batch_size=..., module=..., sharders=..., "
                            f"constraints=...) failed ({type(e).__name__}: {str(e)[:120]}); pass a TorchRec "
                            "StorageReservation") from None
        reserved = False  # nothing left
        left = [0]
    if reserved is not False:
        devices = getattr(reserved, "devices", None)
        try:
            left = [float(getattr(d.storage, field)) for d in devices]
            caps = [float(getattr(d.storage, field)) for d in topology.devices]
        except (TypeError, AttributeError, ValueError):
            left = caps = None
        if left is None or len(left) != len(caps) or not all(math.isfinite(x) for x in left) or any(
                x > c for x, c in zip(left, caps)):
            raise UserError(f"storage_reservation {name}.reserve() must return the topology with each of its "
                            f"{len(topology.devices)} ranks' {memory_kind} reduced (finite, at most the rank's "
                            "own); pass a TorchRec StorageReservation")
    if min(left) <= 0:
        raise UserError(f"TorchRec's {name} leaves rank {int(np.argmin(left))} no {memory_kind} for embedding tables "
                        "(its reserved share, the dense model and the input buffers take it all); raise the "
                        "topology's memory or pass a smaller storage_reservation=")
    return min(left) / 2**30


def planned_constraints(constraints: dict, tables: list[PlannedTable], decided: bool = False) -> dict:
    """The caller's constraints with each table's sharding types cut to those NeuroShard places (table_wise,
    column_wise (or table_column_wise) and/or row_wise, as the enumerator allowed them) and its kernel to `fused`;
    every other field as given (data_parallel on TorchRec's `dense` kernel). `decided`: `tables` holds the row blocks
    of the tables NeuroShard shards row-wise and the replicas of those it runs data-parallel (`row_wise.py`), and
    only those may go row-wise or data-parallel, and only so (the plan TorchRec's planner makes of the same
    choice)."""
    from torchrec.distributed.planner import ParameterConstraints

    out = dict(constraints)
    for table in tables:
        if table.unplaced:  # none of the types NeuroShard places: counted under any type (never used)
            given = constraints.get(table.name)
            if given is not None:
                out[table.name] = dataclasses.replace(given, sharding_types=None, compute_kernels=None)
            continue
        kernels = [FUSED]
        if decided and table.row_block >= 0:
            kinds = [table.row_wise_type]
        elif decided and table.replica >= 0:
            kinds, kernels = [DATA_PARALLEL], [DENSE]
        else:
            kinds = ([] if table.column_wise_only or table.row_wise_only else [TABLE_WISE]) + (
                [table.column_wise_type] if table.splittable else []) + (
                [table.row_wise_type] if table.row_wise and not decided else [])
            if table.data_parallel and not decided:
                kinds, kernels = kinds + [DATA_PARALLEL], [FUSED, DENSE]
        given = constraints.get(table.name)
        out[table.name] = (dataclasses.replace(given, sharding_types=kinds, compute_kernels=kernels)
                           if given is not None else ParameterConstraints(sharding_types=kinds, compute_kernels=kernels))
    return out


class StorageCounter:
    """TorchRec's storage estimator on one module, topology, batch and constraints: the sharding options TorchRec's
    enumerator makes for the module's tables (every type and kernel the constraints allow), enumerated once, then
    given any shards to count."""

    def __init__(self, topology, batch_size: int, constraints: dict, module, sharders):
        from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
        from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator
        from torchrec.distributed.planner.utils import build_sharder_data_map, sharder_name

        self.world = topology.world_size
        self.estimator = EmbeddingStorageEstimator(topology=topology, constraints=constraints)
        try:
            self.options = {(o.path, o.name, o.sharding_type, o.compute_kernel): o for o in EmbeddingEnumerator(
                topology=topology, batch_size=batch_size, constraints=constraints,
                estimator=[self.estimator]).enumerate(module, sharders)}
        except (KeyError, AttributeError, AssertionError, TypeError, ValueError) as e:  # TorchRec reads the fields
            raise UserError(f"TorchRec's storage estimator cannot read the ParameterConstraints ({type(e).__name__}: "
                            f"{str(e)[:120]}); check their fields: output_dtype a DataType, cache_params a CacheParams, "
                            "pooling_factors, num_poolings and batch_sizes one per feature") from None
        self.sharder_data = build_sharder_data_map({sharder_name(s.module_type): s for s in sharders})

    def shards(self, path: str, name: str, sharding_type: str, kernel: str, sizes) -> list | None:
        """The `Storage` (hbm, ddr bytes) of each shard of the given [rows, cols] sizes (None: the option's own
        shards, e.g. a data-parallel table's one per rank); None where the constraints allow no such option."""
        from torchrec.distributed.planner.types import Shard

        option = self.options.get((path, name, sharding_type, kernel))
        if option is None:
            return None
        option = copy.copy(option)
        if sizes is not None:
            option.shards = [Shard(size=[int(r), int(c)], offset=[0, 0]) for r, c in sizes]
        self.estimator.estimate([option], self.sharder_data)
        return [shard.storage for shard in option.shards]

    def halvings(self, tables: list[PlannedTable], rows, dims, memory_kind: str) -> ShardStorage:
        """Every table's storage (`memory_kind`) whole and at each column halving the search may cut, on `fused`."""
        field = memory_field(memory_kind)
        widths = [halvings(d) for d in dims]
        gb = np.full((len(tables), max(map(len, widths))), np.nan)
        for t, table in enumerate(tables):
            gb[t, :len(widths[t])] = np.inf
            if table.unplaced:
                continue  # fits no rank: the search cannot place it
            for k, width in enumerate(widths[t]):
                kind = table.column_wise_type if k > 0 or table.column_wise_only else TABLE_WISE
                if width < table.narrowest(dims[t]):
                    continue  # narrower than min_partition: fits no rank
                counted = self.shards(table.module_path, table.name, kind, FUSED, [(int(rows[t]), width)])
                if counted is not None:  # else a width the table may not take (table-wise only): fits no rank
                    gb[t, k] = getattr(counted[0], field) / 2**30
            if not math.isfinite(gb[t, 0]) and not any((table.module_path, table.name, kind, kernel) in self.options
                                                       for kind, kernel in ((table.row_wise_type, FUSED),
                                                                            (DATA_PARALLEL, DENSE))):
                raise UserError(f"{table.where}: TorchRec's enumerator gives it no {FUSED} option; allow {FUSED!r} in "
                                "its ParameterConstraints.compute_kernels")
        return ShardStorage(np.asarray(dims, np.int64), gb)

    def plan_bytes(self, plan) -> np.ndarray:
        """Bytes of every rank's [HBM, DDR] a TorchRec `ShardingPlan` of the module's tables takes. [world, 2]"""
        used = np.zeros((self.world, 2))
        for path, module_plan in plan.plan.items():
            for name, ps in module_plan.items():
                shards = ps.sharding_spec.shards if ps.sharding_spec is not None else None
                counted = self.shards(path, name, ps.sharding_type, ps.compute_kernel,
                                      None if shards is None else [m.shard_sizes for m in shards])
                if counted is None:
                    raise UserError(f"the plan places {path}.{name} {ps.sharding_type} on {ps.compute_kernel}, which "
                                    "its constraints and sharder do not allow")
                ranks = [m.placement.rank() for m in shards] if shards is not None else list(ps.ranks or
                                                                                          range(len(counted)))
                for storage, rank in zip(counted, ranks):
                    used[rank] += (storage.hbm, storage.ddr)
        return used


def plan_storage(plan, topology, batch_size: int, constraints: dict, module, sharders) -> np.ndarray:
    """Bytes of every rank's [HBM, DDR] that a TorchRec `ShardingPlan` of `module`'s tables takes, each shard counted by
    TorchRec's storage estimator on the same topology, batch and constraints (any sharding type and kernel the
    constraints allow; a data-parallel table on every rank it names). [world, 2]."""
    return StorageCounter(topology, batch_size, constraints, module, sharders).plan_bytes(plan)
