"""Registry of sharding algorithms behind their `--alg` names, and sharding many tasks."""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tqdm import tqdm

from ..core.config import SearchParams
from ..core.errors import UserError
from ..core.costs import Cluster
from ..data.tasks import ShardingTask
from .baselines import GREEDY_KEYS, GreedySharder, RandomSharder
from .plan import Placement, check_complete, fits_memory
from .plan_file import PlanFileSharder
from .risk import RiskAwareSharder
from .search import NeuroShardSharder
from .torchrec_baseline import TorchRecSharder

BASELINES = ["random", *GREEDY_KEYS]
SEARCHES = {"neuroshard", "neuroshard_risk"}  # the algorithms that plan with the cost models
ALGORITHMS = [*BASELINES, "neuroshard", "neuroshard_risk", "torchrec"]


class Sharder(Protocol):
    name: str

    def __call__(self, task: ShardingTask, cluster: Cluster) -> Placement | None: ...


def expand_algs(algs) -> list[str]:
    """The algorithms named: names from `ALGORITHMS`, `all` (every one of them), or `plan:FILE`."""
    names: list[str] = []
    for a in algs:
        if a == "all":
            names += ALGORITHMS
        elif a in ALGORITHMS or (a.startswith("plan:") and len(a) > 5):
            names.append(a)
        else:
            raise UserError(f"unknown --alg {a!r}; choose one of {', '.join(ALGORITHMS)}, all, or plan:FILE")
    if not names:
        raise UserError(f"--alg is empty; choose one of {', '.join(ALGORITHMS)}, all, or plan:FILE")
    return list(dict.fromkeys(names))


def without_unavailable(algs: list[str], asked, simulator) -> list[str]:
    """`algs` less neuroshard_risk where `all` brought it in (`asked`: the names given) and the cost models have no
    ensemble members, with a note saying so; named by itself it stays, and `make_sharder` says what is missing."""
    if "neuroshard_risk" not in algs or "neuroshard_risk" in asked or (simulator is not None and simulator.members):
        return algs
    print("note: --alg all leaves out neuroshard_risk: the cost models have no ensemble members (models/ensemble/); "
          "train them with train_ensemble.py")
    return [a for a in algs if a != "neuroshard_risk"]


def algs_file_tag(algs: list[str]) -> str:
    """`algs` as part of a file name: `a+b`, a plan:FILE as plan-<file stem>, nothing but [A-Za-z0-9_.+-]."""
    tag = "+".join(f"plan-{Path(a[5:]).stem}" if a.startswith("plan:") else a for a in algs)
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", tag)


def make_sharder(alg: str, seed: int = 0, simulator=None, search_params=None, batch_size: int = 4096) -> Sharder:
    """The sharder for `--alg alg`; neuroshard needs a `Simulator` (the pre-trained cost models)."""
    if alg == "random":
        return RandomSharder(seed)
    if alg in GREEDY_KEYS:
        return GreedySharder(alg)
    if alg == "neuroshard":
        if simulator is None:
            raise UserError("--alg neuroshard needs the pre-trained cost models; run train_compute_cost_model.py "
                            "and train_comm_cost_model.py, or pass --compute_model/--fw_comm_model/--bw_comm_model")
        return NeuroShardSharder(simulator, search_params or SearchParams())
    if alg == "neuroshard_risk":
        if simulator is None:
            raise UserError("--alg neuroshard_risk needs the pre-trained cost models and their ensemble members; "
                            "run tools/run_pipeline.py, or train_ensemble.py beside your models")
        return RiskAwareSharder(simulator, search_params or SearchParams())
    if alg == "torchrec":
        return TorchRecSharder(batch_size)
    if alg.startswith("plan:") and len(alg) > 5:
        return PlanFileSharder(alg[5:])
    raise UserError(f"unknown --alg {alg!r}; choose one of {', '.join(ALGORITHMS)} or plan:FILE")


def make_sharders(algs: list[str], simulator=None, search_params=None, batch_size: int = 4096,
                  seed: int = 0) -> dict[str, Sharder]:
    return {alg: make_sharder(alg, seed=seed, simulator=simulator, search_params=search_params,
                              batch_size=batch_size) for alg in algs}


@dataclass
class ShardResult:
    """One task sharded by one algorithm: a memory-feasible plan, or out of memory."""

    plan: Placement | None
    oom: bool
    search_s: float


def shard_task(sharder: Sharder, task: ShardingTask, cluster: Cluster) -> ShardResult:
    t0 = time.perf_counter()
    plan = sharder(task, cluster)
    search_s = time.perf_counter() - t0
    if plan is None:
        return ShardResult(None, True, search_s)
    check_complete(task, plan)
    return ShardResult(plan, not fits_memory(task, plan, cluster), search_s)


def shard_tasks(sharder: Sharder, tasks: list[ShardingTask], cluster: Cluster,
                progress: bool = True) -> list[ShardResult]:
    return [shard_task(sharder, t, cluster)
            for t in tqdm(tasks, desc=f"shard ({sharder.name})", disable=not progress, leave=False)]


def shard_rows(sharders: dict[str, Sharder], tasks: list[ShardingTask], cluster: Cluster):
    """Shard every task with every sharder: (base result row, task, result) per (algorithm, task)."""
    for alg, sharder in sharders.items():
        for i, (task, res) in enumerate(zip(tasks, shard_tasks(sharder, tasks, cluster))):
            row = {"task": i, "alg": alg, "num_tables": task.num_tables, "oom": res.oom, "search_s": res.search_s,
                   "splits": len(res.plan.splits) if res.plan else 0, "plan": res.plan.to_dict() if res.plan else None}
            yield row, task, res
