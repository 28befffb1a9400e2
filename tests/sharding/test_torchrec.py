"""TorchRec's planner as a baseline: plan conversion, completeness, memory, column splits."""
import numpy as np

from neuroshard.core.errors import PlanError
from neuroshard.core.costs import Cluster
import pytest

from neuroshard.sharding.plan import apply_splits, check_complete, fits_memory, plan_from_slices
from neuroshard.data.tasks import ShardingTask

torchrec = pytest.importorskip("torchrec")
from neuroshard.sharding.torchrec_baseline import TorchRecSharder  # noqa: E402


def _task(rows, dims, pf):
    f = np.zeros((len(rows), 19))
    f[:, 0], f[:, 1] = rows, pf
    return ShardingTask(np.arange(len(rows)), np.array(dims), f)


def test_column_shards_become_halving_splits():
    dims = [128, 8, 16]
    plan = plan_from_slices(
        dims, 4, {0: [(0, 32, 0), (32, 32, 1), (64, 32, 2), (96, 32, 3)], 1: [(0, 8, 2)], 2: [(0, 8, 1), (8, 8, 0)]})
    placed = {(s.table, s.col_start, s.dim): d for s, d in zip(plan.shards, plan.device_of)}
    assert placed == {(0, 0, 32): 0, (0, 32, 32): 1, (0, 64, 32): 2, (0, 96, 32): 3, (1, 0, 8): 2,
                      (2, 0, 8): 1, (2, 8, 8): 0}
    assert len(plan.splits) == 3 + 1
    assert apply_splits(dims, plan.splits) == plan.shards
    with pytest.raises(PlanError):
        plan_from_slices([96], 3, {0: [(0, 32, 0), (32, 32, 1), (64, 32, 2)]})  # thirds are not halvings


def test_unequal_halvings_as_neuroshard_makes_them():
    """128 -> 64 + 32 + 32 (a NeuroShard plan) is reached by halving the first half only."""
    plan = plan_from_slices([128, 16], 2, {0: [(0, 64, 1), (64, 32, 0), (96, 32, 1)], 1: [(0, 16, 0)]})
    placed = {(s.table, s.col_start, s.dim): d for s, d in zip(plan.shards, plan.device_of)}
    assert placed == {(0, 0, 64): 1, (0, 64, 32): 0, (0, 96, 32): 1, (1, 0, 16): 0}
    assert len(plan.splits) == 2
    with pytest.raises(PlanError):
        plan_from_slices([128], 2, {0: [(0, 48, 0), (48, 80, 1)]})


def test_torchrec_plans_are_complete_and_fit_memory():
    rng = np.random.default_rng(0)
    sharder = TorchRecSharder(batch_size=4096)
    planned = 0
    for _ in range(4):
        T = int(rng.integers(6, 15))
        task = _task(np.exp(rng.uniform(np.log(1e3), np.log(1e6), T)).round(), rng.choice([8, 16, 32, 64, 128], T),
                     rng.lognormal(1.5, 1, T))
        mem = task.sizes_gb().sum() / 4 * 1.5
        plan = sharder(task, Cluster(4, mem))
        if plan is None:
            continue
        planned += 1
        check_complete(task, plan)
        assert fits_memory(task, plan, Cluster(4, mem))
    assert planned >= 3


def test_dim_128_table_splits_when_it_must():
    # one 1 GB dim-128 table and three small ones; devices of 0.6 GB: only column shards fit
    task = _task([2e6, 1000, 1000, 1000], [128, 8, 8, 8], [100, 1, 1, 1])
    mem = task.sizes_gb()[0] * 0.6
    plan = TorchRecSharder(batch_size=4096)(task, Cluster(4, mem))
    assert plan is not None and plan.splits
    check_complete(task, plan)
    assert fits_memory(task, plan, Cluster(4, mem))
    big = [s for s in plan.shards if s.table == 0]
    assert len(big) > 1 and len({d for s, d in zip(plan.shards, plan.device_of) if s.table == 0}) > 1
    # with room for it, the same table stays whole
    roomy = TorchRecSharder(batch_size=4096)(task, Cluster(4, task.sizes_gb()[0] * 1.2))
    assert len([s for s in roomy.shards if s.table == 0]) == 1


def test_tables_of_dims_that_are_not_powers_of_two_get_halving_blocks():
    """TorchRec cuts a table into blocks of its min_partition: with 4 it cut dim 12 into thirds, which no halving
    plan holds (a traceback). With the narrowest halving block (12 for dims 12, 24 and 48) every plan converts;
    tables that must be split to fit memory are split into halvings."""
    from neuroshard.data.features import smallest_shard_dim

    assert [smallest_shard_dim(d) for d in (4, 8, 12, 16, 24, 48, 96, 128)] == [4, 4, 12, 4, 12, 12, 12, 4]
    task = _task([1e6, 1e6, 1e6, 1000], [12, 48, 96, 16], [1, 3, 2, 1])
    total = task.sizes_gb().sum()
    for mem, tight in ((total, False), (total / 4 * 1.3, True)):  # roomy; then the dim-96 table must be split
        plan = TorchRecSharder(batch_size=4096)(task, Cluster(4, mem))
        assert plan is not None
        check_complete(task, plan)
        assert fits_memory(task, plan, Cluster(4, mem))
        assert all(s.dim % 12 == 0 for s in plan.shards if s.table in (0, 1, 2))
        if tight:
            assert [len([s for s in plan.shards if s.table == t]) > 1 for t in range(4)][2]


@pytest.mark.parametrize("fill", [0.1, 0.5, 0.9])
def test_memory_feasible_small_device_tasks_are_planned(fill):
    """Same memory model as every other algorithm: only weights count. On small devices TorchRec's own
    estimator budgets I/O buffers of the batch (here ~0.03 GB a table) and refused tasks filling 10%."""
    rng = np.random.default_rng(1)
    T = 24
    task = _task(rng.integers(1000, 20000, T), rng.choice([4, 8, 16, 32, 64], T), rng.uniform(1, 40, T))
    mem = task.sizes_gb().sum() / 4 / fill
    assert greedy_fits(task, 4, mem)  # memory-feasible by the plain rows x dim x 4 accounting
    plan = TorchRecSharder(batch_size=65536)(task, Cluster(4, mem))
    assert plan is not None, f"TorchRec refused a task filling {fill:.0%} of the devices"
    check_complete(task, plan)
    assert fits_memory(task, plan, Cluster(4, mem))


def greedy_fits(task, n, mem):
    from neuroshard.sharding.registry import make_sharder, shard_task

    return not shard_task(make_sharder("size_greedy"), task, Cluster(n, mem)).oom
