"""Direct, unbatched NeuroShard search (DESIGN.md §3.5): the oracle the fast search must match.

One threshold, one candidate, one shard and one device at a time, with its own greedy placement written from
§3.5 (not the package's `greedy_place`). A plan's cost is `Simulator.plan_cost`, the unbatched definition the
simulator's users score plans by (the search under test prices plans with batched arrays instead). The only
shared conventions are those §3.5 leaves open (tie-breaking, rounding of predictions to 1 ns, candidate order by
shard position, the memory tolerance).
"""
import numpy as np

from neuroshard.data.features import can_split
from neuroshard.sharding.plan import Placement, apply_splits
from neuroshard.sharding.simulator import round_ms
from neuroshard.data.features import table_size_gb, with_dim


def shard_embeddings(sim, task, shards):
    return sim.compute.embed(with_dim(task.data_features[[s.table for s in shards]], [s.dim for s in shards]))


def single_costs(sim, task, shards):
    return np.array([float(round_ms(sim.compute.head(e))) for e in shard_embeddings(sim, task, shards)])


def place_greedily(order, sizes, N, max_mem, device_cost, dims, cap):
    """§3.5's placement, one shard at a time: to the device with the lowest predicted cost (tie: less memory,
    then the lower id) among those with memory room whose dim sum stays within `cap`; None when none has."""
    tol = 1e-9  # the package's MEM_TOL_GB: sums of float sizes may exceed an exact fit by rounding
    on = [[] for _ in range(N)]
    device_of = [-1] * len(sizes)
    for i in order:
        room = [r for r in range(N) if sum(sizes[j] for j in on[r]) + sizes[i] <= max_mem + tol
                and sum(dims[j] for j in on[r]) + dims[i] <= cap + tol]
        if not room:
            return None
        r = min(room, key=lambda r: (device_cost(on[r]), sum(sizes[j] for j in on[r]), r))
        on[r].append(i)
        device_of[i] = r
    return device_of


def grid_search(sim, task, splits, N, max_mem, params):
    shards = apply_splits(task.dims, splits)
    emb = shard_embeddings(sim, task, shards)
    single = single_costs(sim, task, shards)
    sizes = np.array([table_size_gb(task.rows[s.table], s.dim) for s in shards])
    dims = np.array([float(s.dim) for s in shards])
    order = sorted(range(len(shards)), key=lambda i: (-single[i], i))

    def device_cost(items):
        if not items:
            return 0.0
        total = np.zeros(emb.shape[1])
        for i in items:
            total = total + emb[i]
        return float(round_ms(sim.compute.head(total)))

    best = (np.inf, None)
    for s in params.thresholds():
        cap = s * dims.sum() / N
        device_of = place_greedily(order, sizes, N, max_mem, device_cost, dims, cap)
        if device_of is None:
            continue
        plan = _ordered_plan(N, shards, device_of, order, splits)
        cost = sim.plan_cost(task, plan).cost_ms
        if cost < best[0]:
            best = (cost, device_of)
    return best


def _ordered_plan(N, shards, device_of, order, splits):
    """A plan whose shard list is in placement order (the order the simulator accumulates in)."""
    return Placement(N, [shards[i] for i in order], [device_of[i] for i in order], splits)


def candidates(sim, task, splits, params):
    shards = apply_splits(task.dims, splits)
    single = single_costs(sim, task, shards)
    sizes = [table_size_gb(task.rows[s.table], s.dim) for s in shards]
    pos = [i for i, s in enumerate(shards) if can_split(s.dim)]
    by_size = sorted(pos, key=lambda i: (-sizes[i], i))[:params.num_candidates]
    by_cost = sorted(pos, key=lambda i: (-single[i], i))[:params.num_candidates]
    return sorted(set(by_size) | set(by_cost))


def direct_search(sim, task, cluster, params):
    N, max_mem = cluster.num_devices, cluster.max_mem_gb
    cost, device_of = grid_search(sim, task, [], N, max_mem, params)
    best = (cost, [], device_of)
    beam = [[]]
    for _ in range(params.max_splits):
        scored = []
        for splits in beam:
            for c in candidates(sim, task, splits, params):
                cost, device_of = grid_search(sim, task, splits + [c], N, max_mem, params)
                scored.append((cost, len(scored), splits + [c], device_of))
        if not scored:
            break
        scored.sort(key=lambda x: (x[0], x[1]))
        if scored[0][0] < best[0]:
            best = (scored[0][0], scored[0][2], scored[0][3])
        beam = [x[2] for x in scored[:params.beam_width]]
    if not np.isfinite(best[0]):
        return None, np.inf
    return Placement(N, apply_splits(task.dims, best[1]), list(best[2]), best[1]), best[0]
