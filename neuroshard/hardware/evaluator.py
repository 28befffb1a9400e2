"""Hardware plan evaluator (DESIGN.md §3.7).

N ranks in one process group. For each plan every rank builds one fused operator over the shards
the plan gives it (a column twin reuses its parent table's ids, at its own dim). Compute is
measured one rank at a time (ranks sharing a machine do not disturb each other); then the backward
all-to-all with all ranks together, then the forward all-to-all with each rank starting after its
delay d_r = (compute_r + bw_r) - min_r(...), as in training and in the simulator. A plan's measured
cost is max_r (compute_r + fw_r + bw_r). With `mp_keep` both all-to-alls are DCT-MP's compressed ones
(`comm_bench.make_all_to_all`, the wire format of `mp_wire`).
"""
from __future__ import annotations

import numpy as np
import torch.distributed as dist

from ..core.types import Cost
from ..data.dataset import DLRMDataset
from .backends import Hardware
from .comm_bench import gather_floats, make_all_to_all, timed_collective
from .compute_bench import ComputeBenchmark
from .launch import run_processes


def plan_device_tables(task, plan) -> list[list[tuple[int, int]]]:
    """Per device, the (dataset table id, dim) of each shard it owns: what the ranks build."""
    return [[(int(task.table_ids[s.table]), int(s.dim)) for s in dev] for dev in plan.per_device()]


def _measure_once(bench: ComputeBenchmark, rank: int, world: int, device_tables, hw: Hardware, batch_size: int,
                  warmup: int, iters: int, mp_keep: float | None = None) -> list[list[float]]:
    """Every rank's [compute, fw, bw] ms for one plan: compute one rank at a time, then the all-to-alls."""
    mine = device_tables[rank]
    compute = 0.0
    for r in range(world):  # one rank at a time
        if r == rank and mine:
            compute = bench.measure([t for t, _ in mine], [d for _, d in mine])
        dist.barrier()
    dim_sums = [sum(d for _, d in dev) for dev in device_tables]
    a2a = make_all_to_all(dim_sums, batch_size, rank, hw.device, mp_keep)
    bw = timed_collective(a2a.backward, hw.device, 0.0, warmup, iters)
    ready = np.array([c[0] for c in gather_floats([compute + bw], hw.device)])
    fw = timed_collective(a2a.forward, hw.device, float(ready[rank] - ready.min()), warmup, iters)
    return gather_floats([compute, fw, bw], hw.device)


def eval_rank(rank: int, world: int, emit, dataset_dir: str, hw: Hardware, batch_size: int,
              groups: list[list[tuple[object, list[list[tuple[int, int]]]]]], warmup: int, iters: int,
              rounds: int, mp_keep: float | None = None) -> None:
    """Measure each group's plans in `rounds` alternating rounds (A B C A B C ...), `iters // rounds`
    timed iterations a round; rank 0 emits, per plan, the round with the median cost and every round's cost."""
    per_round = max(1, iters // rounds)
    bench = ComputeBenchmark(DLRMDataset.load(dataset_dir), hw, batch_size, warmup, per_round)
    for group in groups:
        measured: dict[int, list[np.ndarray]] = {i: [] for i in range(len(group))}
        for _ in range(rounds):
            for i, (_, device_tables) in enumerate(group):
                measured[i].append(np.array(_measure_once(bench, rank, world, device_tables, hw, batch_size, warmup,
                                                          per_round, mp_keep)))
        if rank == 0:
            for i, (key, _) in enumerate(group):
                costs = [Cost(m[:, 0], m[:, 1], m[:, 2]).cost_ms for m in measured[i]]
                median_round = int(np.argsort(costs, kind="stable")[(len(costs) - 1) // 2])
                emit((key, measured[i][median_round], costs))


def rounds_rank(rank: int, world: int, emit, dataset_dir: str, hw: Hardware, batch_size: int,
                plans: list[list[list[tuple[int, int]]]], warmup: int, iters: int, stop,
                mp_keep: float | None = None, reference_plans: list | None = None) -> None:
    """Measure `plans` in interleaved rounds until `stop` says enough.

    Every round measures every plan still in the race once, in an order shuffled per round (seeded, the
    same on every rank), so neither a slow period nor a position in the round favours one plan. With
    `reference_plans` round r also measures reference_plans[r % len] as one more plan, last in the cost
    array. After every round rank 0 emits (round index, [P (+1), N, 3] per-device compute/fw/bw ms in plan
    order, NaN for a plan not measured) and asks `stop(round_costs [R, P (+1)], last_round_s)` and, if the
    stop has one, `stop.active(round_costs)` (bool [P]: the plans the next round measures); both answers
    are broadcast so every rank stops, and measures, together."""
    import time

    import torch

    bench = ComputeBenchmark(DLRMDataset.load(dataset_dir), hw, batch_size, warmup, iters)
    P = len(plans)
    active = np.ones(P, bool)
    totals: list[list[float]] = []
    r = 0
    while True:
        t0 = time.perf_counter()
        todo = [i for i in range(P) if active[i]] + ([P] if reference_plans else [])
        order = np.random.default_rng([r, len(todo)]).permutation(len(todo))
        costs = np.full((P + bool(reference_plans), world, 3), np.nan)
        for j in order:
            i = todo[j]
            device_tables = plans[i] if i < P else reference_plans[r % len(reference_plans)]
            costs[i] = _measure_once(bench, rank, world, device_tables, hw, batch_size, warmup, iters, mp_keep)
        answer = torch.zeros(1 + P, dtype=torch.int64, device=hw.device)  # [stop, measure plan i next round...]
        if rank == 0:
            emit((r, costs))
            totals.append([Cost(c[:, 0], c[:, 1], c[:, 2]).cost_ms for c in costs])
            done = bool(stop(np.array(totals), time.perf_counter() - t0))
            keep = active if done or not hasattr(stop, "active") else np.asarray(stop.active(np.array(totals)), bool)
            answer[0] = int(done)
            answer[1:] = torch.as_tensor(keep & active, dtype=torch.int64)
        dist.broadcast(answer, src=0)
        if int(answer[0]):
            return
        active = answer[1:].cpu().numpy().astype(bool)
        r += 1


def measure_plans(dataset: DLRMDataset, hw: Hardware, batch_size: int, plans: dict, num_devices: int,
                  warmup: int, iters: int, on_result=None, gpu_ids=None, rounds: int = 1, group_of=None,
                  mp_keep: float | None = None) -> dict:
    """Measure {key: per-device (table, dim) lists} on `num_devices` ranks; {key: Cost}.

    Plans with the same `group_of(key)` (e.g. one task's plans of every algorithm) are measured
    interleaved in `rounds` rounds, so a slow period of a shared machine hits all of them alike; a
    plan's cost is its median round (`rounds` odd: the exact median). `on_result(key, cost,
    round_costs)` gets each plan as soon as its group is done. `mp_keep`: measure DCT-MP's compressed
    all-to-alls (None: uncompressed)."""
    results = {}

    def on_message(msg):
        key, costs, round_costs = msg
        results[key] = Cost(compute_ms=costs[:, 0], fw_ms=costs[:, 1], bw_ms=costs[:, 2])
        if on_result:
            on_result(key, results[key], round_costs)

    groups: dict = {}
    for key, device_tables in plans.items():
        groups.setdefault(group_of(key) if group_of else None, []).append((key, device_tables))
    if plans:
        run_processes(eval_rank, num_devices,
                      (str(dataset.path), hw, batch_size, list(groups.values()), warmup, iters, rounds, mp_keep),
                      on_message,
                      group_device=hw.device, gpu_ids=gpu_ids)
    return results
