"""Registry of sharding algorithms behind their `--alg` names, and sharding many tasks."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol

from tqdm import tqdm

from .baselines import GREEDY_KEYS, GreedySharder, RandomSharder
from .errors import UserError
from .plan import ShardingPlan, check_complete, fits_memory
from .tasks import ShardingTask

BASELINES = ["random", *GREEDY_KEYS]
ALGORITHMS = [*BASELINES, "neuroshard", "torchrec"]


class Sharder(Protocol):
    name: str

    def __call__(self, task: ShardingTask, num_devices: int, max_mem_gb: float) -> ShardingPlan | None: ...


def parse_algs(text: str) -> list[str]:
    """`--alg` value: one name, a comma-separated list, or `all`."""
    algs = ALGORITHMS if text == "all" else [a.strip() for a in text.split(",") if a.strip()]
    for a in algs:
        if a not in ALGORITHMS:
            raise UserError(f"unknown --alg {a!r}; choose one of {', '.join(ALGORITHMS)} or all")
    return list(algs)


def make_sharder(alg: str, seed: int = 0, **context) -> Sharder:
    """The sharder for `--alg alg`; `context` carries what some need (cost models, ...)."""
    if alg == "random":
        return RandomSharder(seed)
    if alg in GREEDY_KEYS:
        return GreedySharder(alg)
    factory = _EXTRA_SHARDERS.get(alg)
    if factory is not None:
        return factory(seed=seed, **context)
    if alg in ALGORITHMS:
        raise UserError(f"--alg {alg} is not available in this build yet")
    raise UserError(f"unknown --alg {alg!r}; choose one of {', '.join(ALGORITHMS)}")


_EXTRA_SHARDERS: dict[str, Callable[..., Sharder]] = {}


def register(alg: str, factory: Callable[..., Sharder]) -> None:
    _EXTRA_SHARDERS[alg] = factory


@dataclass
class ShardResult:
    """One task sharded by one algorithm: a memory-feasible plan, or out of memory."""

    plan: ShardingPlan | None
    oom: bool
    search_s: float


def shard_task(sharder: Sharder, task: ShardingTask, num_devices: int, max_mem_gb: float) -> ShardResult:
    t0 = time.perf_counter()
    plan = sharder(task, num_devices, max_mem_gb)
    search_s = time.perf_counter() - t0
    if plan is None:
        return ShardResult(None, True, search_s)
    check_complete(task, plan)
    return ShardResult(plan, not fits_memory(task, plan, max_mem_gb), search_s)


def shard_tasks(sharder: Sharder, tasks: list[ShardingTask], num_devices: int, max_mem_gb: float,
                progress: bool = True) -> list[ShardResult]:
    return [shard_task(sharder, t, num_devices, max_mem_gb)
            for t in tqdm(tasks, desc=f"shard ({sharder.name})", disable=not progress, leave=False)]


def add_sharder_args(p) -> None:
    """Arguments some sharders need (cost models for neuroshard)."""
    p.add_argument("--compute_model", default="models/compute.pt")
    p.add_argument("--fw_comm_model", default=None, help="default models/comm_<N>_fw.pt")
    p.add_argument("--bw_comm_model", default=None, help="default models/comm_<N>_bw.pt")


def make_sharders(algs: list[str], args, num_devices: int) -> dict[str, Sharder]:
    """Build the sharders for `algs` from parsed arguments (loading cost models only when needed)."""
    context = {}
    if "neuroshard" in algs and "neuroshard" in _EXTRA_SHARDERS:
        context = {"compute_model": args.compute_model,
                   "fw_comm_model": args.fw_comm_model or f"models/comm_{num_devices}_fw.pt",
                   "bw_comm_model": args.bw_comm_model or f"models/comm_{num_devices}_bw.pt",
                   "num_devices": num_devices}
    return {alg: make_sharder(alg, seed=getattr(args, "seed", 0), **(context if alg == "neuroshard" else {}))
            for alg in algs}
