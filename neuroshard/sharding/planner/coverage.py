"""Does `NeuroShardPlanner` plan wherever TorchRec's planner does, within memory as TorchRec counts it?

One random case is a module of random tables (rows, dims, pooling factors, and an optimizer applied in backward
or none, so the storage estimator counts optimizer state; optionally random sharding types or compute kernels in
their constraints, and dims that are not a multiple of 4),
a topology (cpu or cuda, a rank count, a memory cap
around what the tables need) and a batch. `check_case` plans it with `NeuroShardPlanner` (its defaults) and with
TorchRec's `EmbeddingShardingPlanner` as the user calls it, and says what happened:

- `own`: NeuroShard's plan, each shard counted by TorchRec's storage estimator (`storage.plan_storage`) against the
  budget TorchRec's default reservation leaves a rank (`used_share` of it on the fullest rank);
- `torchrec's`: TorchRec's plan handed out (no plan of NeuroShard's fits, or a table allows only types its search
  does not place: unchanged; or none of the others is rated `min_gain` cheaper than it: counted and checked as
  NeuroShard's own are);
- `both refused`: TorchRec's planner finds no plan either.

A `violation` names what must never happen: a refusal where TorchRec plans, a plan over the budget or outside a
table's allowed sharding types and kernels, a handed-out "TorchRec plan" that is not TorchRec's. `benchmarks/planner_coverage.py` runs many cases; the tests run a few.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...core.errors import UserError
from .incumbent import SHARDING_TYPES

DIMS = (8, 16, 32, 64, 128)
OPTIMIZERS = (None, "sgd", "adam", "adagrad")
KERNELS = {"cuda": ("fused", "dense", "fused_uvm", "fused_uvm_caching"), "cpu": ("fused", "dense")}  # TorchRec's
STATE_PER_WEIGHT = {None: 0, "sgd": 0, "adam": 2, "adagrad": 1}  # about what each keeps per weight


@dataclass
class CoverageCase:
    tables: list[tuple[str, int, int, float]]  # name, rows, dim, pooling factor
    world: int
    device: str                                 # "cpu" or "cuda"
    cap_bytes: int                              # each rank's DDR (cpu) or HBM (cuda)
    batch_size: int                             # per rank
    optimizer: str | None = None                # applied in backward to every table (optimizer state is stored)
    row_wise_sharder: bool = False              # both planners get `sharders.RowWiseSharder` (row_wise on cpu too)
    sharding_types: dict | None = None          # table name -> the sharding types its constraints allow (None: all)
    compute_kernels: dict | None = None         # table name -> the compute kernels its constraints allow (None: all)


@dataclass
class CoverageResult:
    outcome: str                     # own, torchrec's, both refused
    used_share: float = float("nan")  # own: the fullest rank's storage / the budget
    violation: str | None = None
    detail: dict = field(default_factory=dict)


def random_case(rng: np.random.Generator, world: int, device: str, max_tables: int = 9,
                row_wise_sharder: bool = False, constrained_share: float = 0.0, kernel_share: float = 0.0,
                odd_dim_share: float = 0.0) -> CoverageCase:
    """A random case; with `constrained_share` > 0 each table's constraints allow, with that chance, a random
    non-empty subset of TorchRec's sharding types; with `kernel_share`, of the device's compute kernels (`KERNELS`);
    with `odd_dim_share` a table's dim is 2 more (not a multiple of 4). Each is drawn after the rest, so shares of 0
    draw the same cases as before."""
    tables = [(f"t{i}", int(rng.integers(50, 20_000)), int(rng.choice(DIMS)), float(rng.uniform(0.5, 20)))
              for i in range(int(rng.integers(3, max_tables)))]
    optimizer = OPTIMIZERS[int(rng.integers(len(OPTIMIZERS)))]
    stored = sum(r * d * 4 for _, r, d, _ in tables) * (1 + STATE_PER_WEIGHT[optimizer])
    cap = int(stored / world * rng.uniform(0.3, 3.0) + 1_000_000)  # around what TorchRec's count needs
    case = CoverageCase(tables, world, device, cap, int(rng.choice([16, 32, 64])), optimizer, row_wise_sharder)
    if constrained_share > 0:
        case.sharding_types = _random_subsets(rng, tables, constrained_share, SHARDING_TYPES, 0.4)
    if kernel_share > 0:
        case.compute_kernels = _random_subsets(rng, tables, kernel_share, KERNELS[device], 0.5)
    if odd_dim_share > 0:
        case.tables = [(n, r, d + 2 if rng.random() < odd_dim_share else d, pf) for n, r, d, pf in tables]
    return case


def _random_subsets(rng: np.random.Generator, tables, share: float, choices: tuple, each: float) -> dict:
    """{table name: a random non-empty subset of `choices`} for each table with chance `share` (each choice in it
    with chance `each`, one drawn to be sure)."""
    out = {}
    for name, *_ in tables:
        if rng.random() < share:
            picked = rng.random(len(choices)) < each
            picked[int(rng.integers(len(choices)))] = True
            out[name] = [k for k, p in zip(choices, picked) if p]
    return out


def build(case: CoverageCase):
    """(module, topology, constraints, sharders) of a case, the module on the meta device."""
    import torch
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import ParameterConstraints, Topology
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    module = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=n, embedding_dim=d, num_embeddings=r,
                                                               feature_names=[n]) for n, r, d, _ in case.tables],
                                    device=torch.device("meta"))
    if case.optimizer is not None:
        from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

        optimizer = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adagrad": torch.optim.Adagrad}[case.optimizer]
        apply_optimizer_in_backward(optimizer, module.embedding_bags.parameters(), {"lr": 0.01})
    memory = {"hbm_cap": case.cap_bytes} if case.device == "cuda" else {"ddr_cap": case.cap_bytes}
    topology = Topology(world_size=case.world, compute_device=case.device, **memory)
    kinds, kernels = case.sharding_types or {}, case.compute_kernels or {}
    constraints = {n: ParameterConstraints(pooling_factors=[pf], sharding_types=kinds.get(n),
                                           compute_kernels=kernels.get(n)) for n, _, _, pf in case.tables}
    if case.row_wise_sharder:
        from .sharders import RowWiseSharder

        return module, topology, constraints, [RowWiseSharder()]
    return module, topology, constraints, [EmbeddingBagCollectionSharder()]


def check_case(case: CoverageCase, models_dir) -> CoverageResult:
    from .incumbent import torchrec_full_plan
    from .planners import NeuroShardPlanner
    from .storage import default_reservation, plan_storage, reserved_budget

    module, topology, constraints, sharders = build(case)
    theirs = torchrec_full_plan(topology, case.batch_size, constraints, default_reservation(), module, sharders)
    planner = NeuroShardPlanner(topology, batch_size=case.batch_size, constraints=constraints, models_dir=models_dir,
                                debug=False)
    try:
        ours = planner.plan(module, sharders)
    except UserError as e:
        return CoverageResult("both refused", violation=None if theirs is None else f"refused where TorchRec plans: {e}")
    if planner.last_result.plan is None:  # TorchRec's plan, unchanged
        same = theirs is not None and _kinds(ours) == _kinds(theirs)
        return CoverageResult("torchrec's", violation=None if same else "handed out a plan that is not TorchRec's")
    # NeuroShard's plan, or TorchRec's as rated fastest (the user's call, or where the cost models cannot price that
    # one, TorchRec's call on the kernels they price): each counted and checked against the constraints
    kind = int(case.device == "cpu")  # HBM on cuda, DDR on cpu
    budget = reserved_budget(default_reservation(), topology, case.batch_size, module, sharders, constraints,
                             ("HBM", "DDR")[kind]) * 2**30
    used = float(plan_storage(ours, topology, case.batch_size, constraints, module, sharders)[:, kind].max())
    outside = [f"{name} {kind_}/{kernel}" for (_, name), (kind_, kernel, _) in _kinds(ours).items()
               if kind_ not in (constraints[name].sharding_types or [kind_])
               or kernel not in (constraints[name].compute_kernels or [kernel])]
    violation = (f"a rank holds {used:,.0f} bytes, over its {budget:,.0f}" if used > budget else
                 f"placed outside its constraints: {', '.join(outside)}" if outside else None)
    return CoverageResult("torchrec's" if planner.last_result.chosen == "torchrec" else "own", used / budget, violation,
                          {"used_bytes": used, "budget_bytes": budget,
                           "types": sorted({kind for kind, _, _ in _kinds(ours).values()})})


def _kinds(plan) -> dict:
    return {(path, name): (ps.sharding_type, ps.compute_kernel, tuple(ps.ranks or ()))
            for path, module_plan in plan.plan.items() for name, ps in module_plan.items()}
