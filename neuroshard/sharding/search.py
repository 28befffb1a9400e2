"""NeuroShard search (DESIGN.md §3.5): beam search over column splits, greedy grid search over
table-wise placements, every candidate scored by the simulator.

- Column split: a shard of dim d becomes d/2 plus a twin of d/2 (same rows, ids and features),
  allowed while d/2 is divisible by 4.
- Grid search: for each threshold s in `grid_steps` values of `threshold_range`, shards sorted by
  predicted single-shard compute cost (largest first) go to the device with the lowest current
  predicted compute cost (tie: less memory, then lower id) among devices with memory room whose dim
  sum stays <= s * total_dim / N; the device's cost is re-predicted on its new set. Complete
  placements are scored by the simulator; the best one wins. A row block of a table TorchRec shards
  row-wise and a replica of a data-parallel one (`ShardingTask.row_block`, `.replica`: `NeuroShardPlanner`) go to
  their own ranks, past the dim-sum cap.
- Beam search: width k; each state is expanded by splitting one candidate shard (union of the
  `num_candidates` largest and most expensive splittable shards); the k best new states go on;
  the best plan seen at any depth (including no split) is returned.

`neuroshard_top_plans` also returns the next best distinct plans the search scored (for measuring
several candidates, DESIGN.md §8); its first plan is always `neuroshard_search`'s.

Roles, as in TorchRec's planner: the beam proposes shard lists, the grid search (the partitioner) places each
on the devices by predicted compute, and a rating of complete placements (`Rate`; by default the simulator's,
`simulated_costs`) ranks them: which threshold wins, which states go on in the beam, which plan is the best.
The dim-sum thresholds are widened once per entry point where a block that must stay whole would fit no rank
(`fitting_thresholds`).

Speed: every (state, candidate, threshold) greedy of one depth runs in lockstep on numpy arrays, a
device's prediction is updated incrementally (its embedding sum plus the new shard's, then the small
head network), rows whose next shard fits no device leave the batch, and BLAS runs on one thread (the
search multiplies thousands of small matrices, and a multi-threaded BLAS on a busy machine waits for its
threads on every one of them). tests/oracle_search.py is the direct, one-at-a-time implementation; both
return exactly the same plan (tests/sharding/search_golden.json holds the plans the search must give).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
from threadpoolctl import ThreadpoolController

from ..core.config import SearchParams
from ..core.costs import MEM_TOL_GB, Cluster, round_ms
from ..data.features import can_split, halvings, input_words, smallest_shard_dim, with_dim
from ..data.tasks import ShardingTask
from .plan import Placement, apply_splits
from .simulator import Simulator, comm_widths, group_sums


class ShardTable:
    """Embeddings, single-shard costs and sizes of every (table, dim) a search can produce."""

    def __init__(self, sim: Simulator, task: ShardingTask):
        keys = [(t, d) for t, dim in enumerate(task.dims) for d in halvings(dim)]
        self.index = {k: i for i, k in enumerate(keys)}
        tables = np.array([k[0] for k in keys])
        dims = np.array([k[1] for k in keys])
        self.features = with_dim(task.data_features[tables], dims)
        self.emb = sim.compute.embed(self.features)
        self.single_cost = round_ms(sim.compute.head(self.emb))
        self.size = task.shard_sizes_gb(tables, dims)
        self.dim = dims.astype(np.float64)
        self.comm_dim = comm_widths(task, tables, dims, sim.num_devices, sim.compute.meta.get("batch_size"))
        self.group = task.shard_groups(tables, dims)  # the shard's sharding group (`simulator.GROUPS`)
        self.pinned = task.pinned_ranks(tables)     # the rank a row block or replica must go to; -1: the search chooses
        self.any_pinned = bool((self.pinned >= 0).any())
        self.replica = task.shard_replicas(tables)  # replicas compute apart (`Simulator.replica_compute_ms`)
        self.in_set = (self.replica < 0).astype(np.int64)  # 1: the shard is in its rank's operator
        self.set_emb = self.emb * self.in_set[:, None]       # what a shard adds to its rank's set (0 for a replica)
        self._whole = dims == np.asarray(task.dims)[tables]  # a replica is never split: its whole-table row
        self.replica_ms = self.replica_ms_of(sim, self.emb)
        self.input_words = input_words(task.pooling_factors[tables])
        self._member_set: dict[int, tuple[np.ndarray, float]] = {}

    def replica_ms_of(self, sim: Simulator, emb: np.ndarray) -> float:
        """What the replicas add to each rank's compute, from `sim`'s embeddings of these shards."""
        return sim.replica_compute_ms(emb[self._whole], self.replica[self._whole])

    def member_set(self, k: int, member: Simulator) -> tuple[np.ndarray, float]:
        """Ensemble member k's `set_emb` and `replica_ms` of these shards (`sharding/risk.py`), computed once."""
        if k not in self._member_set:
            emb = member.compute.embed(self.features)
            self._member_set[k] = (emb * self.in_set[:, None], self.replica_ms_of(member, emb))
        return self._member_set[k]


@dataclass
class Placements:
    """Complete placements of shard lists of one length, batched: each shard's ShardTable row and device [P, L],
    and per device the compute the grid search predicted and the dim sum [P, N]."""

    items: np.ndarray
    devices: np.ndarray
    compute: np.ndarray
    dim_sums: np.ndarray


# places shard lists of one length: (ShardTable, lists, cluster, params) -> (costs [E], assignments [E, L])
Partition = Callable[[ShardTable, list, Cluster, SearchParams], tuple[np.ndarray, np.ndarray]]
# rates complete placements: (ShardTable, Placements) -> predicted cost (ms) [P]; the search keeps the lowest
Rate = Callable[[ShardTable, Placements], np.ndarray]


def simulated_costs(sim: Simulator, st: ShardTable, p: Placements) -> np.ndarray:
    """The simulator's cost of each complete placement: its step cost (`Simulator.step_total_cost`) or the
    paper's (`Simulator.total_cost`), as `sim.cost` says."""
    if sim.cost == "step":
        dims, words = group_sums(st.group[p.items], p.devices, st.comm_dim[p.items], st.input_words[p.items],
                                 p.compute.shape[1])
        return sim.step_total_cost(p.compute, dims, words)[0]
    return sim.total_cost(p.compute, p.dim_sums)[0]


def candidate_shards(shard_keys: list[tuple[int, int]], st: ShardTable, num_candidates: int,
                     no_split: frozenset[int] = frozenset()) -> list[int]:
    """Union of the largest and the most expensive splittable shards (tables in `no_split` never), by position."""
    pos = [i for i, (t, d) in enumerate(shard_keys) if can_split(d) and t not in no_split]
    if not pos:
        return []
    idx = np.array([st.index[shard_keys[i]] for i in pos])
    by_size = np.argsort(-st.size[idx], kind="stable")[:num_candidates]
    by_cost = np.argsort(-st.single_cost[idx], kind="stable")[:num_candidates]
    return sorted({pos[j] for j in np.concatenate([by_size, by_cost])})


def split_keys(shard_keys: list[tuple[int, int]], i: int) -> list[tuple[int, int]]:
    t, d = shard_keys[i]
    out = list(shard_keys)
    out[i] = (t, d // 2)
    out.append((t, d // 2))
    return out


def grid_search_batch(sim: Simulator, st: ShardTable, states: list[list[tuple[int, int]]], cluster: Cluster,
                      params: SearchParams, rate: Rate | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Best grid-search placement of each shard list (all of one length): devices chosen by the simulator's
    predicted compute, complete placements ranked by `rate` (default: `simulated_costs`).

    Returns costs [E] (inf where no threshold gives a complete placement) and assignments [E, L].
    """
    N, max_mem_gb, thresholds = cluster.num_devices, cluster.max_mem_gb, params.thresholds()
    G, E, L = len(thresholds), len(states), len(states[0])
    item = np.array([[st.index[k] for k in s] for s in states])            # [E, L] -> ShardTable row
    order = np.argsort(-st.single_cost[item], axis=1, kind="stable")       # [E, L] shard positions
    total_dim = st.dim[item].sum(axis=1)                                   # [E]
    cap = (thresholds[None, :] * total_dim[:, None] / N).reshape(-1)       # [R]
    R, D = E * G, st.emb.shape[1]
    # per placing row (expansion x threshold); rows whose shard fits no device leave the batch
    live = np.arange(R)                                                    # their global row ids
    exp_of = np.repeat(np.arange(E), G)
    emb_sum = np.zeros((R, N, D))
    cost = np.zeros((R, N))
    mem = np.zeros((R, N))
    dsum = np.zeros((R, N))
    count = np.zeros((R, N), dtype=np.int64)
    assign = np.full((R, L), -1)
    for k in range(L):
        pos = order[exp_of, k]
        it = item[exp_of, pos]
        sz, dm = st.size[it], st.dim[it]
        room = mem + sz[:, None] <= max_mem_gb + MEM_TOL_GB
        ok = room & (dsum + dm[:, None] <= cap[:, None] + MEM_TOL_GB)
        if st.any_pinned:  # a row block or replica goes to its own rank, past the dim-sum cap
            pin = st.pinned[it][:, None]
            ok = np.where(pin >= 0, room & (np.arange(N)[None, :] == pin), ok)
        fits = ok.any(axis=1)
        if not fits.all():
            keep = np.flatnonzero(fits)
            live, exp_of, cap, pos, it, sz, dm, ok, emb_sum, cost, mem, dsum, count = (
                a[keep] for a in (live, exp_of, cap, pos, it, sz, dm, ok, emb_sum, cost, mem, dsum, count))
            if len(live) == 0:
                break
        # the device with the lowest cost among those with room; ties: less memory, then the lower id
        c = np.where(ok, cost, np.inf)
        dev = np.where(c == c.min(axis=1, keepdims=True), mem, np.inf).argmin(axis=1)
        cell = np.arange(len(live)) * N + dev                              # (row, device) in the flat views
        flat_emb = emb_sum.reshape(-1, D)
        flat_emb[cell] = flat_emb[cell] + st.set_emb[it]
        mem.reshape(-1)[cell] += sz
        dsum.reshape(-1)[cell] += dm
        count.reshape(-1)[cell] += st.in_set[it]
        cost.reshape(-1)[cell] = sim.set_cost(flat_emb[cell], count.reshape(-1)[cell])
        assign[live, pos] = dev
    total = np.full(R, np.inf)
    if len(live):
        placed = Placements(item[exp_of], assign[live], cost + st.replica_ms, dsum)
        total[live] = rate(st, placed) if rate is not None else simulated_costs(sim, st, placed)
    total = total.reshape(E, G)
    best_g = total.argmin(axis=1)  # first threshold among equals
    best = total[np.arange(E), best_g]
    return best, assign.reshape(E, G, L)[np.arange(E), best_g]


def _search(sim: Simulator, task: ShardingTask, cluster: Cluster, params: SearchParams,
            seen: list | None = None, no_split: frozenset[int] = frozenset(),
            partition: Partition | None = None) -> tuple:
    """The beam search with `params` as given (thresholds already widened), BLAS on one thread; returns (cost,
    splits, assignment) of the best plan; tables in `no_split` stay whole (table-wise). With `seen`, every scored
    expansion's (cost, splits, assignment) is appended to it in generation order. `partition` places and rates
    each depth's shard lists (default: `grid_search_batch`)."""
    sim.check_devices(cluster.num_devices)
    if partition is None:
        def partition(st, states, cluster, params):
            return grid_search_batch(sim, st, states, cluster, params)
    with _blas_threads().limit(limits=1, user_api="blas"):
        return _beam_search(sim, task, cluster, params, seen, no_split, partition)


@functools.lru_cache(maxsize=1)
def _blas_threads() -> ThreadpoolController:
    """The process's thread pools, found once (finding them reads every loaded library)."""
    return ThreadpoolController()


def _beam_search(sim: Simulator, task: ShardingTask, cluster: Cluster, params: SearchParams,
                 seen: list | None, no_split: frozenset[int], partition: Partition) -> tuple:
    st = ShardTable(sim, task)
    base = [(t, int(d)) for t, d in enumerate(task.dims)]
    cost, assign = partition(st, [base], cluster, params)
    best = (cost[0], [], assign[0])
    if seen is not None:
        seen.append(best)
    beam = [([], base)]
    for _ in range(params.max_splits):
        expansions = [(splits + [c], split_keys(keys, c))
                      for splits, keys in beam for c in candidate_shards(keys, st, params.num_candidates, no_split)]
        if not expansions:
            break
        costs, assigns = partition(st, [e[1] for e in expansions], cluster, params)
        if seen is not None:
            seen.extend((costs[j], expansions[j][0], assigns[j]) for j in range(len(expansions)))
        ranked = np.argsort(costs, kind="stable")  # by cost, then generation order
        for j in ranked[:1]:
            if costs[j] < best[0]:
                best = (costs[j], expansions[j][0], assigns[j])
        beam = [expansions[j] for j in ranked[:params.beam_width]]
    return best


def _plan(task: ShardingTask, cluster: Cluster, found) -> Placement:
    _, splits, assign = found
    return Placement(cluster.num_devices, apply_splits(task.dims, splits), [int(x) for x in assign], list(splits))


def plan_key(plan: Placement) -> tuple:
    """What makes two plans the same: the multiset of (table, column slice) per device, devices unordered."""
    return tuple(sorted(tuple(sorted((s.table, s.col_start, s.dim) for s in dev)) for dev in plan.per_device()))


def neuroshard_search(sim: Simulator, task: ShardingTask, cluster: Cluster, params: SearchParams = SearchParams(),
                      no_split: frozenset[int] = frozenset(), partition: Partition | None = None) -> Placement | None:
    """The best plan found, or None if none fits memory; tables in `no_split` stay whole (table-wise);
    `partition` replaces the grid search (`grid_search_batch`'s arguments and results, less the simulator). The
    thresholds are widened first (`fitting_thresholds`)."""
    return search_plan(sim, task, cluster, fitting_thresholds(task, cluster.num_devices, params, no_split)[0],
                       no_split, partition)


def search_plan(sim: Simulator, task: ShardingTask, cluster: Cluster, params: SearchParams,
                no_split: frozenset[int] = frozenset(), partition: Partition | None = None) -> Placement | None:
    """`neuroshard_search` with `params` as given: for a caller that has widened the thresholds itself."""
    best = _search(sim, task, cluster, params, no_split=no_split, partition=partition)
    return _plan(task, cluster, best) if np.isfinite(best[0]) else None


def neuroshard_top_plans(sim: Simulator, task: ShardingTask, cluster: Cluster, k: int,
                         params: SearchParams = SearchParams()) -> list[tuple[float, Placement]]:
    """The search's best plan, then the next best distinct plans it scored: up to k (simulated cost, plan).

    The first is exactly `neuroshard_search`'s plan; the others are the cheapest other complete
    placements seen during the beam search (any depth), one per distinct `plan_key`."""
    seen: list = []
    best = _search(sim, task, cluster, fitting_thresholds(task, cluster.num_devices, params)[0], seen)
    if not np.isfinite(best[0]):
        return []
    first = _plan(task, cluster, best)
    out, keys = [(float(best[0]), first)], {plan_key(first)}
    for i in sorted(range(len(seen)), key=lambda i: (seen[i][0], i)):
        if len(out) >= k or not np.isfinite(seen[i][0]):
            break
        plan = _plan(task, cluster, seen[i])
        if plan_key(plan) not in keys:
            keys.add(plan_key(plan))
            out.append((float(seen[i][0]), plan))
    return out


def fitting_thresholds(task: ShardingTask, num_devices: int, params: SearchParams,
                       no_split: frozenset[int] = frozenset(), names=None) -> tuple[SearchParams, str | None]:
    """`params` with the dim-sum thresholds' upper end widened just enough for the widest block some table must
    keep (its whole dim if it is in `no_split`, else the narrowest block halving reaches, e.g. 12 for dim 12):
    a rank's dim sum is capped at hi x total dim / N, so such a block wider than that would fit no rank and the
    grid would find no plan at all, whatever the memory. (params, None) when nothing needs widening, else with
    the note that says so (`names`: the tables' names, default table i)."""
    dims = np.asarray(task.dims, np.int64)
    if not len(dims) or dims.sum() <= 0:
        return params, None
    pinned = task.pinned_ranks(np.arange(len(dims))) >= 0  # row blocks and replicas are past the cap
    keep = [0 if pinned[t] else int(d) if t in no_split else smallest_shard_dim(d) for t, d in enumerate(dims)]
    t = int(np.argmax(keep))
    need = float(keep[t]) * num_devices / float(dims.sum())
    lo, hi = params.threshold_range
    if need <= hi:
        return params, None
    name = names[t] if names is not None else f"table {t}"
    what = (f"table-wise-only {name} (dim {keep[t]})" if t in no_split else
            f"{name} (dim {keep[t]}, which cannot be split)" if keep[t] == dims[t] else
            f"{name} (dim {int(dims[t])}, whose narrowest column block is {keep[t]})")
    wide = (need, need) if params.grid_steps == 1 else (lo, need)  # one grid step searches lo alone
    return replace(params, threshold_range=wide), (
        f"note: dim-sum thresholds widened to {wide[0]:.3g}-{wide[1]:.3g} (search setting {lo:g}-{hi:g}) so that "
        f"{what} fits one rank")


class NeuroShardSharder:
    name = "neuroshard"

    def __init__(self, sim: Simulator, params: SearchParams = SearchParams()):
        self.sim, self.params = sim, params
        self.note: str | None = None  # the last call's threshold note (`fitting_thresholds`), if any

    def __call__(self, task: ShardingTask, cluster: Cluster) -> Placement | None:
        params, self.note = fitting_thresholds(task, cluster.num_devices, self.params)
        return search_plan(self.sim, task, cluster, params)
