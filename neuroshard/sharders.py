"""Registry of sharding algorithms behind their `--alg` names, and sharding many tasks."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

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


def make_sharder(alg: str, seed: int = 0, simulator=None, search_params=None, batch_size: int = 4096) -> Sharder:
    """The sharder for `--alg alg`; neuroshard needs a `Simulator` (the pre-trained cost models)."""
    if alg == "random":
        return RandomSharder(seed)
    if alg in GREEDY_KEYS:
        return GreedySharder(alg)
    if alg == "neuroshard":
        from .search import NeuroShardSharder, SearchParams

        if simulator is None:
            raise UserError("--alg neuroshard needs the pre-trained cost models; run train_compute_cost_model.py "
                            "and train_comm_cost_model.py, or pass --compute_model/--fw_comm_model/--bw_comm_model")
        return NeuroShardSharder(simulator, search_params or SearchParams())
    if alg == "torchrec":
        from .torchrec_baseline import TorchRecSharder

        return TorchRecSharder(batch_size)
    raise UserError(f"unknown --alg {alg!r}; choose one of {', '.join(ALGORITHMS)}")


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


def shard_rows(sharders: dict[str, Sharder], tasks: list[ShardingTask], num_devices: int, max_mem_gb: float):
    """Shard every task with every sharder: (base result row, task, result) per (algorithm, task)."""
    for alg, sharder in sharders.items():
        for i, (task, res) in enumerate(zip(tasks, shard_tasks(sharder, tasks, num_devices, max_mem_gb))):
            row = {"task": i, "alg": alg, "num_tables": task.num_tables, "oom": res.oom, "search_s": res.search_s,
                   "splits": len(res.plan.splits) if res.plan else 0, "plan": res.plan.to_dict() if res.plan else None}
            yield row, task, res


def add_sharder_args(p) -> None:
    """Arguments of the neuroshard sharder: cost models and search parameters (DESIGN.md §3.5)."""
    p.add_argument("--compute_model", default="models/compute.pt")
    p.add_argument("--fw_comm_model", default=None, help="default models/comm_<N>_fw.pt")
    p.add_argument("--bw_comm_model", default=None, help="default models/comm_<N>_bw.pt")
    p.add_argument("--beam_width", type=int, default=3)
    p.add_argument("--num_candidates", type=int, default=10)
    p.add_argument("--max_splits", type=int, default=10)
    p.add_argument("--grid_steps", type=int, default=11)
    p.add_argument("--threshold_range", default="1.0,1.5")


def model_paths(args, num_devices: int) -> tuple[str, str, str]:
    """Compute, forward-comm and backward-comm model paths (comm defaults depend on the device count)."""
    return (args.compute_model, args.fw_comm_model or f"models/comm_{num_devices}_fw.pt",
            args.bw_comm_model or f"models/comm_{num_devices}_bw.pt")


def load_simulator(args, num_devices: int):
    from .simulator import Simulator

    sim = Simulator.load(*model_paths(args, num_devices))
    sim.check_devices(num_devices)
    return sim


def make_sharders(algs: list[str], args, num_devices: int, simulator=None, batch_size: int = 4096) -> dict[str, Sharder]:
    """Build the sharders for `algs` from parsed arguments (loading cost models only when needed)."""
    from .cli import float_range
    from .search import SearchParams

    if "neuroshard" in algs and simulator is None:
        simulator = load_simulator(args, num_devices)
    params = SearchParams(args.beam_width, args.num_candidates, args.max_splits, args.grid_steps,
                          float_range(args.threshold_range, "--threshold_range"))
    return {alg: make_sharder(alg, seed=getattr(args, "seed", 0), simulator=simulator, search_params=params,
                              batch_size=batch_size)
            for alg in algs}
