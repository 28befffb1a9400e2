"""Baseline sharders (DESIGN.md §3.6), the shared greedy, plans and column splits."""
import itertools

import numpy as np
import pytest

from neuroshard.sharding.baselines import GREEDY_KEYS
from neuroshard.core.errors import PlanError
from neuroshard.core.costs import Cluster
from neuroshard.sharding.greedy import greedy_place, largest_first
from neuroshard.sharding.plan import Placement, apply_splits, check_complete, fits_memory
from neuroshard.sharding.registry import BASELINES, make_sharder, shard_task
from neuroshard.data.tasks import ShardingTask



def _task(rows, dims, pf=None):
    rows = np.asarray(rows, dtype=np.float64)
    pf = np.ones(len(rows)) if pf is None else np.asarray(pf, dtype=np.float64)
    feats = np.zeros((len(rows), 19))
    feats[:, 0], feats[:, 1] = rows, pf
    return ShardingTask(np.arange(len(rows)), np.asarray(dims), feats)


def _exists_feasible(task, n, max_mem):
    sizes = task.sizes_gb()
    for assign in itertools.product(range(n), repeat=task.num_tables):
        mem = np.bincount(assign, weights=sizes, minlength=n)
        if np.all(mem <= max_mem + 1e-9):
            return True
    return False


@pytest.mark.parametrize("alg", BASELINES)
def test_baselines_complete_and_feasible(small_dataset, alg):
    rng = np.random.default_rng(0)
    sharder = make_sharder(alg, seed=0)
    for _ in range(20):
        T = int(rng.integers(2, 7))
        task = ShardingTask.from_dataset(small_dataset, rng.integers(0, 24, T), rng.choice([4, 8, 16, 32], T))
        res = shard_task(sharder, task, Cluster(3, 10.0))   # ample memory: always feasible
        assert not res.oom
        check_complete(task, res.plan)
        assert fits_memory(task, res.plan, Cluster(3, 10.0))


@pytest.mark.parametrize("alg", BASELINES)
def test_baselines_report_out_of_memory(alg):
    GB = 2**30 / 4  # rows of a 1 GB table at dim 1
    # each table 1 GB at dim 4 -> sizes 1 GB; 3 tables, 2 devices of 1.5 GB: impossible
    task = _task([GB / 4] * 3, [4, 4, 4])
    assert not _exists_feasible(task, 2, 1.5)
    res = shard_task(make_sharder(alg), task, Cluster(2, 1.5))
    assert res.oom
    # 4 tables of 1 GB on 2 devices of 2 GB: feasible, and the greedy heuristics find it
    task = _task([GB / 4] * 4, [4, 4, 4, 4])
    if alg != "random":
        res = shard_task(make_sharder(alg), task, Cluster(2, 2.0))
        assert not res.oom and fits_memory(task, res.plan, Cluster(2, 2.0))


def test_random_never_silently_overfull():
    task = _task([2**28 / 4] * 8, [4] * 8)  # 8 tables of 1 GB
    for seed in range(10):
        res = shard_task(make_sharder("random", seed=seed), task, Cluster(4, 2.0))
        assert res.oom == (not fits_memory(task, res.plan, Cluster(4, 2.0)))


def test_greedy_keys_by_hand():
    # rows, dims and pooling factors chosen so each key orders the tables differently.
    task = _task(rows=[10**6, 10**3, 10**4], dims=[8, 64, 16], pf=[1.0, 1.0, 20.0])
    keys = {name: f(task) for name, f in GREEDY_KEYS.items()}
    assert keys["dim_greedy"].tolist() == [8, 64, 16]
    assert np.allclose(keys["size_greedy"], task.sizes_gb())
    assert keys["lookup_greedy"].tolist() == [8, 64, 320]
    assert np.allclose(keys["size_lookup_greedy"], [8 * 6, 64 * 3, 320 * 4])
    assert largest_first(keys["dim_greedy"]).tolist() == [1, 2, 0]
    assert largest_first(keys["size_greedy"]).tolist() == [0, 2, 1]
    assert largest_first(keys["lookup_greedy"]).tolist() == [2, 1, 0]
    # dim_greedy on 2 devices: 64 -> dev0, 16 -> dev1, 8 -> dev1 (accumulated 16 < 64)
    plan = make_sharder("dim_greedy")(task, Cluster(2, 100.0))
    assert plan.device_of == [1, 0, 1]


def test_greedy_tie_breaks_on_smaller_memory():
    sizes = np.array([3.0, 1.0, 0.5])
    keys = np.array([0.0, 0.0, 0.0])  # all costs tie: memory decides
    dev = greedy_place([0, 1, 2], sizes, 2, 10.0, lambda items: float(keys[items].sum()))
    assert dev == [0, 1, 1]


def test_column_splits():
    shards = apply_splits([128, 8], [0, 0, 2])
    assert [(s.table, s.col_start, s.dim) for s in shards] == [(0, 0, 32), (1, 0, 8), (0, 64, 32), (0, 32, 32),
                                                              (0, 96, 32)]
    with pytest.raises(ValueError):
        apply_splits([4], [0])
    with pytest.raises(ValueError):
        apply_splits([8], [0, 0])  # 8 -> 4 -> 2 not allowed
    task = _task([100, 100], [128, 8])
    plan = Placement(2, shards, [0, 1, 1, 0, 1], [0, 0, 2])
    check_complete(task, plan)
    bad = Placement(2, shards[:-1], [0, 1, 1, 0], [0, 0, 2])
    with pytest.raises(PlanError):
        check_complete(task, bad)
