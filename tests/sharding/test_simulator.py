"""The simulator (DESIGN.md §3.4) against costs worked out by hand.

The three networks get hand-set weights so that, through the z-normalisation (mean 1, std 2 on
every input) and the ReLUs, they compute exactly:
    per table      0.01 * dim + 0.1 * pooling + 0.5;  a device's compute = sum over its tables + 0.2
    backward r     0.3 + 0.002 * dimsum_r + 0.001 * sum_q dimsum_q
    forward r      1.0 + 0.003 * dimsum_r + 0.25 * sum_q delay_q - 0.5 * delay_r
so every term of §3.4 (compute per device, an empty device costing 0, the backward model on dim
sums, the delays d_r = (compute_r + bw_r) - min, the forward model on dim sums + delays, the max
over devices of the sum) changes the numbers below if it is broken.
"""
import re

import numpy as np
import pytest

from neuroshard.core.errors import UserError
from neuroshard.core.costs import Cluster
from neuroshard.data.tasks import ShardingTask
from neuroshard.sharding.plan import Placement, apply_splits
from neuroshard.sharding.simulator import Simulator

from analytic_models import hand_comm_model, hand_compute_model

def _task():
    feats = np.zeros((3, 19))
    feats[:, 0] = [1000, 2000, 500]   # rows
    feats[:, 1] = [2.0, 10.0, 1.0]    # pooling factors
    return ShardingTask(np.arange(3), np.array([8, 16, 4]), feats)


def _sim(N):
    return Simulator(hand_compute_model(), hand_comm_model(N, "fw"), hand_comm_model(N, "bw"))


def test_two_devices_by_hand():
    task = _task()
    plan = Placement(2, apply_splits(task.dims, []), [0, 1, 0])
    cost = _sim(2).plan_cost(task, plan)
    # compute: dev0 = (0.08+0.2+0.5) + (0.04+0.1+0.5) + 0.2 = 1.62; dev1 = (0.16+1.0+0.5) + 0.2 = 1.86
    assert cost.compute_ms == pytest.approx([1.62, 1.86], abs=1e-6)
    # backward on dim sums [12, 16] (total 28): 0.3 + 0.002 d + 0.028
    assert cost.bw_ms == pytest.approx([0.352, 0.360], abs=1e-6)
    # ready = [1.972, 2.220] -> delays [0, 0.248]; fw = 1 + 0.003 d + 0.25 * 0.248 - 0.5 * delay
    assert cost.fw_ms == pytest.approx([1.098, 0.986], abs=1e-6)
    assert cost.per_device_ms == pytest.approx([3.070, 3.206], abs=1e-6)
    assert cost.cost_ms == pytest.approx(3.206, abs=1e-6) and cost.critical_device == 1


def test_empty_device_and_straggler_delays_by_hand():
    task = _task()
    plan = Placement(3, apply_splits(task.dims, []), [0, 1, 0])  # device 2 holds nothing
    cost = _sim(3).plan_cost(task, plan)
    assert cost.compute_ms == pytest.approx([1.62, 1.86, 0.0], abs=1e-6)
    assert cost.bw_ms == pytest.approx([0.352, 0.360, 0.328], abs=1e-6)
    # ready = [1.972, 2.220, 0.328] -> delays [1.644, 1.892, 0] (sum 3.536)
    assert cost.fw_ms == pytest.approx([1.098, 0.986, 1.884], abs=1e-6)
    assert cost.per_device_ms == pytest.approx([3.070, 3.206, 2.212], abs=1e-6)
    assert cost.cost_ms == pytest.approx(3.206, abs=1e-6)


def test_column_split_costs_by_hand():
    task = _task()
    # table 1 (dim 16) split into two halves of 8, one on each device
    plan = Placement(2, apply_splits(task.dims, [1]), [0, 0, 1, 1])
    cost = _sim(2).plan_cost(task, plan)
    # dev0: table0 (0.78) + half of table1 (0.08+1.0+0.5) + 0.2 = 2.56; dev1: table2 (0.64) + half (1.58) + 0.2
    assert cost.compute_ms == pytest.approx([2.56, 2.42], abs=1e-6)
    assert plan.device_dim_sums().tolist() == [16, 12]


def test_out_of_memory_plan_is_never_scored():
    task = _task()
    plan = Placement(2, apply_splits(task.dims, []), [0, 0, 0])
    size = task.sizes_gb().sum()
    assert _sim(2).plan_cost(task, plan, Cluster(2, size * 0.99)) is None
    assert _sim(2).plan_cost(task, plan, Cluster(2, size)) is not None


def test_a_plan_beyond_the_comm_data_gets_one_note_naming_what_and_how_far():
    """The two-device plan above (dim sums 12 / 16, ready 1.972 / 2.220: a straggler wait of 0.248 ms) against
    the largest dim sums and delays the forward model records from its training data."""
    task = _task()
    plan = Placement(2, apply_splits(task.dims, []), [0, 1, 0])
    bw = hand_comm_model(2, "bw")
    for top, want in (([10, 10, 0.2, 0.2], ["dim sum reaches 16 (the comm data: at most 10)",
                                             "straggler wait 0.2 ms (the comm data: at most 0.2 ms)"]),
                      ([10, 10, 0.25, 0.25], ["dim sum reaches 16"]),
                      ([16, 12, 0.1, 0.2], ["straggler wait"]),
                      ([16, 16, 0.25, 0.25], None)):
        sim = Simulator(hand_compute_model(), hand_comm_model(2, "fw", meta={"training_input_max": top}), bw)
        note = sim.comm_coverage_note(plan.device_dim_sums(), sim.plan_cost(task, plan))
        if want is None:
            assert note is None
        else:
            assert note.startswith("note: this plan lies beyond the comm cost data") and "--T_range" in note
            assert all(w in note for w in want) and note.count("(the comm data") == len(want), note
    assert _sim(2).comm_coverage_note(plan.device_dim_sums(), _sim(2).plan_cost(task, plan)) is None  # no record


# ----------------------------------------------------------------------------- the step cost (cost="step")
# input words per shard = 2 x pooling + 2: table 0 -> 6, table 1 -> 22, table 2 -> 4; the input distribution is
# priced by the backward model on them, per sharding group, as each group's backward and forward all-to-alls.

def test_step_cost_one_group_by_hand():
    task = _task()
    plan = Placement(2, apply_splits(task.dims, []), [0, 1, 0])
    cost = _sim(2).with_cost("step").plan_cost(task, plan)
    assert cost.compute_ms == pytest.approx([1.62, 1.86], abs=1e-6)
    # backward on dims [12, 16] -> [0.352, 0.360]; input on words [10, 22] (total 32) -> [0.352, 0.376]
    assert cost.bw_ms == pytest.approx([0.704, 0.736], abs=1e-6)
    # ready [2.324, 2.596] -> delays [0, 0.272]; forward 1 + 0.003 d + 0.068 - 0.5 delay
    assert cost.fw_ms == pytest.approx([1.104, 0.980], abs=1e-6)
    assert cost.cost_ms == pytest.approx(3.576, abs=1e-6)


def test_step_cost_prices_the_input_distribution_by_its_own_model_by_hand():
    task = _task()
    plan = Placement(2, apply_splits(task.dims, []), [0, 1, 0])
    inp = hand_comm_model(2, "input")  # 5 + 0.01 x own input words
    sim = Simulator(hand_compute_model(), hand_comm_model(2, "fw"), hand_comm_model(2, "bw"), inp=inp)
    cost = sim.with_cost("step").plan_cost(task, plan)
    # input on words [10, 22] -> [5.100, 5.220]; backward on dims [12, 16] -> [0.352, 0.360]
    assert cost.bw_ms == pytest.approx([5.452, 5.580], abs=1e-6)
    # ready [7.072, 7.440] -> delays [0, 0.368]; forward 1 + 0.003 d + 0.092 - 0.5 delay
    assert cost.fw_ms == pytest.approx([1.128, 0.956], abs=1e-6)
    assert cost.cost_ms == pytest.approx(8.396, abs=1e-6)
    # the paper's cost ignores it; without the model the step cost prices the words by the backward model
    assert sim.plan_cost(task, plan).cost_ms == _sim(2).plan_cost(task, plan).cost_ms
    assert sim.with_cost("step").input_model_note() is None and "backward comm model" in \
        _sim(2).with_cost("step").input_model_note()
    # a model of another direction or device count in its place is refused
    with pytest.raises(UserError, match="input comm model given is a bw model"):
        Simulator(hand_compute_model(), hand_comm_model(2, "fw"), hand_comm_model(2, "bw"),
                  inp=hand_comm_model(2, "bw"))
    with pytest.raises(UserError, match="input-distribution model is for 3 devices"):
        Simulator(hand_compute_model(), hand_comm_model(2, "fw"), hand_comm_model(2, "bw"),
                  inp=hand_comm_model(3, "input"))


def test_step_cost_charges_a_column_split_its_own_group_by_hand():
    task = _task()
    shards = apply_splits(task.dims, [1])  # table 1 in two 8-column halves
    dev = [0 if s.table == 0 or (s.table == 1 and s.col_start == 0) else 1 for s in shards]
    plan = Placement(2, shards, dev, [1])
    cost = _sim(2).with_cost("step").plan_cost(task, plan)
    assert cost.compute_ms == pytest.approx([2.56, 2.42], abs=1e-6)
    # table-wise group: dims [8, 4], words [6, 4] -> bw [0.328, 0.320], input [0.322, 0.318]
    # column-wise group: dims [8, 8], words [22, 22] -> bw [0.332, 0.332], input [0.388, 0.388]
    assert cost.bw_ms == pytest.approx([1.370, 1.358], abs=1e-6)
    # ready [3.930, 3.778] -> delays [0.152, 0]; the table-wise forward waits for them: [0.986, 1.050]; the
    # column-wise one after it starts together (no delays): 1 + 0.003 x 8 = [1.024, 1.024]
    assert cost.fw_ms == pytest.approx([2.010, 2.074], abs=1e-6)
    assert cost.cost_ms == pytest.approx(5.940, abs=1e-6)
    # the paper's cost of the same plan sees one all-to-all of each direction and no input distribution
    assert _sim(2).plan_cost(task, plan).cost_ms < cost.cost_ms - 1.0


def test_step_cost_search_scores_plans_as_the_simulator_does():
    from analytic_models import analytic_simulator

    from neuroshard.core.config import SearchParams
    from neuroshard.sharding.search import neuroshard_top_plans

    rng = np.random.default_rng(3)
    feats = np.zeros((12, 19))
    feats[:, 0] = rng.integers(100, 5000, 12)
    feats[:, 1] = rng.uniform(1, 30, 12)
    task = ShardingTask(np.arange(12), rng.choice([16, 32, 64, 128], 12), feats)
    sim = analytic_simulator(4).with_cost("step")
    top = neuroshard_top_plans(sim, task, Cluster(4, 1.0), 6, SearchParams(max_splits=4))
    assert len(top) >= 3 and any(p.splits for _, p in top)
    for cost, plan in top:
        assert cost == pytest.approx(sim.plan_cost(task, plan).cost_ms, abs=1e-6)


def _rw_dp_task(with_table_wise: bool):
    """Table 0 whole (dim 8, optional), tables 1-2 the two row blocks of a row-wise table (dim 16), tables 3-4 the
    two replicas of a data-parallel one (dim 4, 500 rows)."""
    feats = np.zeros((5, 19))
    feats[:, 0] = [1000, 800, 800, 500, 500]
    feats[:, 1] = [2.0, 3.0, 3.0, 1.0, 1.0]
    keep = np.arange(5) if with_table_wise else np.arange(1, 5)
    task = ShardingTask(np.arange(5)[keep], np.array([8, 16, 16, 4, 4])[keep], feats[keep],
                        row_block=np.array([-1, 0, 1, -1, -1])[keep], replica=np.array([-1, -1, -1, 0, 1])[keep])
    dev = np.array([0, 0, 1, 0, 1])[keep]
    return task, Placement(2, apply_splits(task.dims, []), list(dev))


def test_replicas_compute_apart_at_the_local_batch_in_the_plan_cost_and_the_search():
    """A rank's replicas are an operator of their own at its local batch: each rank's compute is the set cost of its
    other shards plus the set of every replicated table at the global batch over the ranks (`replica_compute_ms`),
    not the replicas in the rank's set; the search rates its plans as `plan_cost` does."""
    from neuroshard.core.config import SearchParams
    from neuroshard.data.features import with_dim
    from neuroshard.sharding.search import neuroshard_top_plans

    sim = _sim(2).with_cost("step")
    for table_wise in (True, False):
        task, plan = _rw_dp_task(table_wise)
        emb = sim.compute.embed(with_dim(task.data_features, task.dims))
        rep = task.shard_replicas(np.arange(task.num_tables))
        want = []
        for d in range(2):
            mine = [i for i, dev in enumerate(plan.device_of) if dev == d and rep[i] < 0]
            want.append(sim.set_cost(emb[mine].sum(axis=0)[None], np.array([len(mine)]))[0])
        replicas = sim.set_cost(emb[rep == 0].sum(axis=0)[None], np.array([1]))[0] / 2
        assert sim.replica_compute_ms(emb, rep) == pytest.approx(replicas, abs=1e-6) and replicas > 0
        assert sim.plan_cost(task, plan).compute_ms == pytest.approx(np.array(want) + replicas, abs=1e-6)
        in_set = np.array(want)  # the replicas in the rank's own set instead: another cost
        both = [sim.set_cost(emb[[i for i, dev in enumerate(plan.device_of) if dev == d]].sum(axis=0)[None],
                             np.array([1]))[0] for d in range(2)]
        assert np.abs(np.array(both) - (in_set + replicas)).max() > 1e-3
        for cost, found in neuroshard_top_plans(sim, task, Cluster(2, 1.0), 3, SearchParams(max_splits=2)):
            assert cost == pytest.approx(sim.plan_cost(task, found).cost_ms, abs=1e-6)
    assert sim.replica_compute_ms(emb, np.full(len(emb), -1)) == 0.0


def test_step_cost_prices_row_wise_and_data_parallel_collectives_by_their_own_costs():
    from neuroshard.models.collective_models import CollectiveCost, CollectiveModels
    from neuroshard.sharding.simulator import comm_widths

    coll = CollectiveModels(2, 4096, {"reduce_scatter": CollectiveCost(2.0, 0.1), "all_gather": CollectiveCost(1.0, 0.05),
                                      "all_reduce": CollectiveCost(3.0, 0.2)}, {})
    plain = _sim(2).with_cost("step")
    with_coll = plain.with_collectives(coll)
    assert with_coll.with_step_fit(None).coll is coll and with_coll.with_cost("paper").coll is coll
    for table_wise in (True, False):
        task, plan = _rw_dp_task(table_wise)
        a, b = plain.plan_cost(task, plan), with_coll.plan_cost(task, plan)
        assert b.compute_ms == pytest.approx(a.compute_ms)
        # backward: the row-wise group's all-gather of 16 columns, the data-parallel group's all-reduce of its width
        # (floats a ring sends per sample), in place of the backward all-to-all model on the same widths; the
        # all-reduce runs beside the other groups' backwards (DDP), so a rank pays the larger of the two
        dp = float(comm_widths(task, [task.num_tables - 1], [4], 2, None)[0])
        rw_bw, dp_bw = (plain.bw.predict_np(np.array([[w, w]]))[0] for w in (16.0, dp))
        tw_bw = plain.bw.predict_np(np.array([[8.0, 0.0]]))[0] if table_wise else 0.0
        gather, reduce = 1.0 + 0.05 * 16, 3.0 + 0.2 * dp
        assert b.bw_ms - a.bw_ms == pytest.approx(np.maximum(tw_bw + gather, reduce) - np.maximum(tw_bw + rw_bw, dp_bw),
                                                  abs=1e-6)
        assert np.abs((b.bw_ms - a.bw_ms) - (gather - rw_bw + reduce - dp_bw)).min() > 1e-3  # not in series
        ready = b.compute_ms + b.bw_ms
        if table_wise:  # the table-wise group's forward goes first and waits; the reduce-scatter starts together
            waits = ready - ready.min()
            assert b.fw_ms - (2.0 + 0.1 * 16) == pytest.approx(plain.fw.predict_np(
                np.array([[8.0, 0.0, *waits]]))[0], abs=1e-6)
        else:  # the reduce-scatter is the first group: each rank also waits for the last-ready one
            assert b.fw_ms == pytest.approx(2.0 + 0.1 * 16 + (ready.max() - ready), abs=1e-6)
    # the paper's cost has no such groups; collectives for another device count are refused
    task, plan = _rw_dp_task(True)
    assert with_coll.with_cost("paper").plan_cost(task, plan).cost_ms == plain.with_cost("paper").plan_cost(
        task, plan).cost_ms
    with pytest.raises(UserError, match="collectives costs are for 3 devices"):
        plain.with_collectives(CollectiveModels(3, 4096, coll.costs, {}))


def test_collectives_costs_beside_the_comm_models_are_loaded_or_refused_by_name(tmp_path):
    """`Simulator.from_files` loads comm_<N>_collectives.json from beside the backward model (ensemble members
    share it); one for another device count, or of another batch, is one line naming what differs."""
    from analytic_models import save_hand_models

    from neuroshard.models.collective_models import CollectiveCost, CollectiveModels

    folder = save_hand_models(tmp_path / "models", 2, {"batch_size": 64})
    assert Simulator.from_files(folder, 2).coll is None
    costs = {k: CollectiveCost(1.0, 0.01) for k in ("reduce_scatter", "all_gather", "all_reduce")}
    CollectiveModels(2, 64, costs, {"batch_size": 64}).save(folder / "comm_2_collectives.json")
    sim = Simulator.from_files(folder, 2)
    assert sim.coll.costs["all_reduce"].latency_ms == 1.0 and sim.with_cost("step").coll is sim.coll
    CollectiveModels(4, 64, costs, {"batch_size": 64}).save(folder / "comm_2_collectives.json")
    with pytest.raises(UserError, match=re.escape(f"{folder}/comm_2_collectives.json holds collectives costs for 4 "
                                                  "devices, the comm models are for 2; make them with "
                                                  "collect_comm_cost_data.py --collectives --ndevices 2")):
        Simulator.from_files(folder, 2)
    CollectiveModels(2, 128, costs, {"batch_size": 128}).save(folder / "comm_2_collectives.json")
    with pytest.raises(UserError, match="cost models come from different batch sizes"):
        Simulator.from_files(folder, 2)
