"""Planning for DCT-MP's compressed all-to-all: the simulator with compressed comm models on a case
worked out by hand, comm models of one all-to-all never used for another, and --mp_keep checked.

The compressed comm models are tests/analytic_models.py's hand-set networks with every dim-sum
coefficient scaled by the bytes DCT-MP sends per dim at mp_keep 0.05 (compression/mp_topk.py): forward
0.05 * 3 / 4 (fp16 value + uint8 index instead of an fp32 value), backward 0.05 (fp32 gradients of
the kept entries only).
"""
import itertools
import math

import numpy as np
import pytest

from neuroshard.core.config import (CommCollectConfig, EvalConfig, EvalSimConfig, ShardTablesConfig, SearchParams,
                                    TrainCommConfig, check_mp_keep)
from neuroshard.core.errors import UserError
from neuroshard.core.file_names import comm_data_path, comm_model_paths
from neuroshard.core.costs import Cluster
from neuroshard.data.tasks import ShardingTask
from neuroshard.compression import mp_topk
from neuroshard.sharding.plan import Placement, apply_splits
from neuroshard.sharding.search import NeuroShardSharder
from neuroshard.sharding.simulator import Simulator

from analytic_models import hand_comm_model, hand_compute_model

KEEP = 0.05
B, W = 4096, 200   # any batch, and a width with uint8 indices (<= 256 columns)
FW_SCALE = mp_topk.fw_send_bytes([W, W], 0, B, KEEP) / (B * W * 4)
BW_SCALE = mp_topk.bw_send_bytes([W, W], B, KEEP) / (B // 2 * 2 * W * 4)


def _sims(N=2):
    dense = Simulator(hand_compute_model(), hand_comm_model(N, "fw"), hand_comm_model(N, "bw"))
    comp = Simulator(hand_compute_model(), hand_comm_model(N, "fw", FW_SCALE, {"mp_keep": KEEP}),
                     hand_comm_model(N, "bw", BW_SCALE, {"mp_keep": KEEP}))
    return dense, comp


def test_byte_ratios_are_the_wire_formats():
    assert FW_SCALE == pytest.approx(KEEP * 3 / 4) and BW_SCALE == pytest.approx(KEEP)


def test_compressed_models_by_hand():
    feats = np.zeros((3, 19))
    feats[:, 0] = [1000, 2000, 500]
    feats[:, 1] = [2.0, 10.0, 1.0]
    task = ShardingTask(np.arange(3), np.array([8, 16, 4]), feats)
    _, comp = _sims()
    assert comp.mp_keep == KEEP
    cost = comp.plan_cost(task, Placement(2, apply_splits(task.dims, []), [0, 1, 0]))
    assert cost.compute_ms == pytest.approx([1.62, 1.86], abs=1e-6)
    # backward on dim sums [12, 16]: 0.3 + 0.05 * (0.002 d + 0.001 * 28)
    assert cost.bw_ms == pytest.approx([0.3026, 0.3030], abs=1e-6)
    # ready [1.9226, 2.1630] -> delays [0, 0.2404]; fw = 1 + 0.0375 * 0.003 d + 0.25 * 0.2404 - 0.5 * delay
    assert cost.fw_ms == pytest.approx([1.06145, 0.9417], abs=1e-6)
    assert cost.cost_ms == pytest.approx(1.86 + 0.3030 + 0.9417, abs=1e-6)


def _placements(task, N):
    for a in itertools.product(range(N), repeat=task.num_tables):
        if a[0] == 0:  # device symmetry
            yield Placement(N, apply_splits(task.dims, []), list(a))


def test_cheap_communication_moves_the_best_plan_towards_compute_balance():
    feats = np.zeros((4, 19))
    feats[:, 0] = 1000
    feats[:, 1] = [2.0, 2.0, 10.0, 20.0]
    task = ShardingTask(np.arange(4), np.array([4, 128, 32, 16]), feats)
    dense, comp = _sims()
    best_dense = min(_placements(task, 2), key=lambda p: dense.plan_cost(task, p).cost_ms)
    best_comp = min(_placements(task, 2), key=lambda p: comp.plan_cost(task, p).cost_ms)
    # uncompressed: the 128-dim table shares a device with the tiny one (dim sums 132 / 48);
    # compressed: the two lookup-heavy tables are split up (compute 3.6 / 4.0 ms instead of 2.92 / 4.68)
    assert list(best_dense.device_of) == [0, 0, 1, 1] and list(best_comp.device_of) == [0, 1, 1, 0]
    c = comp.plan_cost(task, best_comp)
    assert c.compute_ms == pytest.approx([3.6, 4.0], abs=1e-6)
    # NeuroShard searching with the compressed models beats the uncompressed-optimal plan when both
    # run compressed
    plan = NeuroShardSharder(comp, SearchParams())(task, Cluster(2, 1.0))
    assert comp.plan_cost(task, plan).cost_ms < comp.plan_cost(task, best_dense).cost_ms - 0.05


def test_models_of_another_all_to_all_are_refused(tmp_path):
    _, comp = _sims()
    hand_compute_model().save(tmp_path / "c.pt")
    comp.fw.save(tmp_path / "fw_mp.pt")
    comp.bw.save(tmp_path / "bw_mp.pt")
    hand_comm_model(2, "fw").save(tmp_path / "fw.pt")
    hand_comm_model(2, "bw").save(tmp_path / "bw.pt")
    hand_comm_model(2, "bw", meta={"mp_keep": 0.1}).save(tmp_path / "bw_mp0.1.pt")
    sim = Simulator.load(tmp_path / "c.pt", tmp_path / "fw_mp.pt", tmp_path / "bw_mp.pt", 2, mp_keep=KEEP)
    assert sim.mp_keep == KEEP
    with pytest.raises(UserError, match=r"DCT-MP compressed \(mp_keep 0.05\) all-to-all, this run is uncompressed; "
                                        r"pass --mp_keep 0.05"):
        Simulator.load(tmp_path / "c.pt", tmp_path / "fw_mp.pt", tmp_path / "bw_mp.pt", 2)
    with pytest.raises(UserError, match="trained on the uncompressed all-to-all, this run is DCT-MP compressed"):
        Simulator.load(tmp_path / "c.pt", tmp_path / "fw.pt", tmp_path / "bw.pt", 2, mp_keep=KEEP)
    with pytest.raises(UserError, match="mp_keep 0.05, the backward one for 0.1"):
        Simulator.load(tmp_path / "c.pt", tmp_path / "fw_mp.pt", tmp_path / "bw_mp0.1.pt", 2, mp_keep=KEEP)
    with pytest.raises(UserError, match="mp_keep None, the backward one for 0.05"):
        Simulator.load(tmp_path / "c.pt", tmp_path / "fw.pt", tmp_path / "bw_mp.pt", 2)


def test_file_names_say_how_the_all_to_all_was_sent():
    assert comm_data_path("d", 4).name == "comm_cost_data_4.pkl"
    assert comm_data_path("d", 4, 0.05).name == "comm_cost_data_4_mp0.05.pkl"
    assert [p.name for p in comm_model_paths("m", 8, 0.05)] == ["comm_8_mp0.05_fw.pt", "comm_8_mp0.05_bw.pt"]
    assert [p.name for p in comm_model_paths("m", 8)] == ["comm_8_fw.pt", "comm_8_bw.pt"]
    assert TrainCommConfig(mp_keep=0.05).data_path.name == "comm_cost_data_4_mp0.05.pkl"
    assert [p.name for p in TrainCommConfig(mp_keep=1.0).out_paths()] == ["comm_4_fw.pt", "comm_4_bw.pt"]
    assert [p.name for p in EvalConfig().models.paths(4, 0.2)] == ["compute.pt", "comm_4_mp0.2_fw.pt",
                                                                   "comm_4_mp0.2_bw.pt"]


@pytest.mark.parametrize("value", [0, -1, 1.5, math.nan, math.inf, "x"])
def test_bad_mp_keep_is_refused_by_every_step(value):
    with pytest.raises(UserError, match="--mp_keep must be"):
        check_mp_keep(value)
    with pytest.raises(UserError, match="--mp_keep must be"):
        CommCollectConfig(mp_keep=value).check(2)
    for cfg in (EvalSimConfig(mp_keep=value), EvalConfig(mp_keep=value), ShardTablesConfig(mp_keep=value, tables="t")):
        with pytest.raises(UserError, match="--mp_keep must be"):
            cfg.check()
    with pytest.raises(UserError, match="--mp_keep must be"):
        TrainCommConfig(mp_keep=value).data_path


def test_mp_keep_one_is_uncompressed():
    assert check_mp_keep(1.0) is None and check_mp_keep(None) is None and check_mp_keep(0.05) == 0.05
