"""`NeuroShardPlanner`'s constructor arguments, each checked and turned into what its components take: the
topology into a `Cluster` (weights-only memory per rank), the constraints and search parameters checked, the cost
models loaded (`Simulator.from_files`) or the simulator given taken, the batch size defaulted. Every argument the
planner cannot take is one `UserError` that names it as a caller sets it."""
from __future__ import annotations

import math

import os
from dataclasses import dataclass

import numpy as np

from ...core.config import CostModelFiles, SearchParams
from ...core.errors import UserError
from ...core.costs import MAX_DEVICE_MEM_GB, Cluster
from ...models.loading import cost_model_paths
from ..simulator import Simulator, check_cost

DEFAULT_BATCH_SIZE = 512  # per rank, where the cost models do not record the batch they were trained at


@dataclass(frozen=True)
class Ranks:
    """What the planner takes of a TorchRec `Topology`."""

    cluster: Cluster
    device_type: str  # the topology's compute_device
    memory_kind: str  # HBM, or DDR on CPU ranks


def topology_ranks(topology) -> Ranks:
    """The topology's world size and each rank's budget: its HBM (its DDR when `compute_device="cpu"`), the smallest
    rank's where they differ."""
    world = getattr(topology, "world_size", None)
    if not hasattr(topology, "devices") or isinstance(world, bool) or not isinstance(world, int):
        raise UserError("NeuroShardPlanner needs topology=torchrec.distributed.planner.Topology(world_size=N, "
                        f"compute_device=..., hbm_cap=...), got {type(topology).__name__}")
    if world < 2:
        raise UserError(f"NeuroShardPlanner plans for 2 or more ranks (its comm models predict an all-to-all), got "
                        f"Topology(world_size={world}); a single rank holds every table and needs no plan")
    device_type = str(topology.compute_device)
    if device_type not in ("cpu", "cuda"):
        raise UserError(f"NeuroShardPlanner plans for cpu or cuda ranks, got Topology(compute_device={device_type!r}); "
                        "plan it with EmbeddingShardingPlanner")
    memory_kind = "DDR" if device_type == "cpu" else "HBM"
    raw = [d.storage.ddr if memory_kind == "DDR" else d.storage.hbm for d in topology.devices]
    bad = next((r for r, cap in enumerate(raw) if not math.isfinite(cap)), None)
    if bad is not None:
        raise UserError(f"the topology gives rank {bad} {raw[bad]} bytes of {memory_kind}; pass Topology(..., "
                        f"{memory_kind.lower()}_cap=BYTES), a finite number")
    caps = [int(cap) for cap in raw]
    if min(caps) <= 0:
        raise UserError(f"the topology gives rank {int(np.argmin(caps))} no {memory_kind} for embedding "
                        f"tables; pass Topology(..., {memory_kind.lower()}_cap=BYTES)")
    mem_cap_gb = min(caps) / 2**30
    if mem_cap_gb > MAX_DEVICE_MEM_GB:
        raise UserError(f"the topology gives each rank {mem_cap_gb:.3g} GB of {memory_kind}, more than "
                        f"{MAX_DEVICE_MEM_GB:g} GB; pass Topology(..., {memory_kind.lower()}_cap=BYTES) "
                        f"of at most {int(MAX_DEVICE_MEM_GB * 2**30)} bytes")
    return Ranks(Cluster(world, mem_cap_gb), device_type, memory_kind)


def checked_constraints(constraints) -> dict:
    """{table name: ParameterConstraints}, a copy (None: none)."""
    from torchrec.distributed.planner import ParameterConstraints

    if constraints is not None and not isinstance(constraints, dict):
        raise UserError("constraints must be a dict {table name: ParameterConstraints}, "
                        f"got {type(constraints).__name__}")
    for name, c in (constraints or {}).items():
        if not isinstance(c, ParameterConstraints):
            raise UserError(f"constraints[{name!r}] is a {type(c).__name__}; pass "
                            "torchrec.distributed.planner.ParameterConstraints(pooling_factors=[...], ...)")
    return dict(constraints or {})


MAX_IDS_PER_TABLE = 100_000_000  # ids= per table: a batch's sample, not a dataset


def checked_ids(ids) -> dict[str, np.ndarray]:
    """{table name: 1-D int64 array}, a copy, from `ids=` (None: none): each value a 1-D tensor or array of whole
    numbers >= 0, at least one; the range against each table's rows is checked when the tables are known
    (`EmbeddingBagEnumerator`)."""
    if ids is None:
        return {}
    if not isinstance(ids, dict):
        raise UserError(f"ids must be a dict {{table name: 1-D tensor of the ids it is looked up with}}, got "
                        f"{type(ids).__name__}")
    out = {}
    for name, value in ids.items():
        where = f"ids[{str(name)[:60]!r}]"
        if not isinstance(name, str):
            raise UserError(f"{where}: keys must be table names (str), got {type(name).__name__}")
        if hasattr(value, "detach"):
            if getattr(value, "is_meta", False):
                raise UserError(f"{where}: a tensor on the meta device holds no ids; pass the ids themselves")
            value = value.detach().cpu().numpy()
        if not isinstance(value, np.ndarray):
            raise UserError(f"{where}: pass a 1-D torch tensor or numpy array of ids, got {type(value).__name__}")
        if value.ndim != 1 or not value.size:
            raise UserError(f"{where}: pass a non-empty 1-D tensor of ids (the table's lookups in a batch), got shape "
                            f"{tuple(value.shape)}")
        if value.size > MAX_IDS_PER_TABLE:
            raise UserError(f"{where}: {value.size:,} ids is more than {MAX_IDS_PER_TABLE:,}; pass a batch's sample")
        if value.dtype.kind not in "iu":
            raise UserError(f"{where}: ids must be integers, got dtype {value.dtype}")
        if value.min() < 0 or (value.dtype.kind == "u" and value.max() > np.iinfo(np.int64).max):
            raise UserError(f"{where}: ids must be row numbers (>= 0 and below the table's rows), got "
                            f"{int(value.min()) if value.min() < 0 else int(value.max())}")
        out[name] = value.astype(np.int64, copy=True)
    return out


def checked_search(search) -> SearchParams:
    if not isinstance(search, SearchParams):
        raise UserError(f"search must be a neuroshard.core.config.SearchParams, got {type(search).__name__}")
    try:
        return search.check()
    except UserError as e:  # its messages name the shard_tables flags; here they are the fields
        raise UserError(f"NeuroShardPlanner: search={search}: {str(e).replace('--', '')}") from None


@dataclass(frozen=True)
class ModelArguments:
    """The planner's cost-model arguments as the caller gave them."""

    models_dir: str | os.PathLike | None = "models"
    compute_model: str | os.PathLike | None = None
    fw_comm_model: str | os.PathLike | None = None
    bw_comm_model: str | os.PathLike | None = None
    input_comm_model: str | os.PathLike | None = None

    def files(self, world: int) -> CostModelFiles:
        """The files they name: each given one, else the models folder's default."""
        for name, value in vars(self).items():
            if value is not None and (not isinstance(value, (str, os.PathLike)) or not str(value).strip()):
                raise UserError(f"NeuroShardPlanner: {name} must be a file path (str or pathlib.Path), got "
                                f"{type(value).__name__} {str(value)[:40]!r}")
        if self.models_dir is None and None in (self.compute_model, self.fw_comm_model, self.bw_comm_model):
            raise UserError("NeuroShardPlanner: models_dir=None needs compute_model, fw_comm_model and bw_comm_model "
                            "(the model files); pass them, or the folder that holds them as models_dir")
        compute, fw, bw = cost_model_paths(self.models_dir or ".", world)
        return CostModelFiles(str(self.compute_model or compute), str(self.fw_comm_model or fw),
                              str(self.bw_comm_model or bw), self.input_comm_model)


def planner_simulator(simulator, cost: str, world: int, models: ModelArguments) -> tuple[Simulator, tuple]:
    """The simulator that scores plans by `cost`, and what its models are, as the notes name them: the model files
    loaded (the input-distribution model's where there is one), or the simulator or calibration given."""
    files = models.files(world)
    try:
        check_cost(cost, "cost=")
        if simulator is None:
            simulator = Simulator.from_files(files, world)
            sources = tuple(files.paths(world)) + ((files.input_path(world)[0],) if simulator.inp is not None else ())
        else:
            simulator, sources = given_simulator(simulator, world)
        return simulator.with_cost(cost), sources
    except UserError as e:
        raise UserError(f"NeuroShardPlanner: {e}") from None


def given_simulator(simulator, world: int) -> tuple[Simulator, tuple[str]]:
    """A `Simulator`, or the (Simulator, report) pair of `planning.calibration_file.read_calibration`, checked against the
    world size; and the words that name it."""
    given = "the simulator given"
    if isinstance(simulator, tuple) and len(simulator) == 2 and isinstance(simulator[1], dict):
        simulator, report = simulator
        given = f"the calibration given (fingerprint {report.get('fingerprint', '?')})"
    if not isinstance(simulator, Simulator):
        raise UserError(f"simulator must be a neuroshard Simulator or the (Simulator, report) pair of "
                        f"planning.calibration_file.read_calibration, got {type(simulator).__name__}")
    simulator.check_devices(world)
    return simulator, (given,)


def planner_batch_size(batch_size, model_batch, world: int) -> int:
    """Samples per rank: `batch_size`, else the models' global batch divided by the world size."""
    if batch_size is None:
        batch_size = max(1, int(model_batch) // world) if model_batch else DEFAULT_BATCH_SIZE
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UserError(f"batch_size must be a whole number >= 1 (samples per rank), got {batch_size!r}")
    return batch_size
