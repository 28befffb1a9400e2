"""Cost models: known costs recovered, save/load round trip, device checks, and the scripted pipeline."""
import re

import numpy as np
import pytest
import torch

from neuroshard.models.cost_models import CommCostModel, ComputeCostModel
from neuroshard.core.errors import UserError
from neuroshard.models.training_loops import regression_metrics, split_indices

from conftest import refused, run_script


def _linear_compute_data(n=1500, seed=0):
    rng = np.random.default_rng(seed)
    T = 6
    feats = np.zeros((n, T, 20), np.float32)
    feats[..., 0] = rng.choice([4, 8, 16, 32, 64, 128], (n, T))
    feats[..., 1] = rng.uniform(100, 1e5, (n, T))
    feats[..., 2] = rng.uniform(0, 30, (n, T))
    feats[..., 3:] = rng.dirichlet(np.ones(17), (n, T))
    counts = rng.integers(1, T + 1, n)
    mask = (np.arange(T)[None] < counts[:, None]).astype(np.float32)
    per_table = 0.02 * feats[..., 0] + 0.1 * feats[..., 2] + 1e-5 * feats[..., 1] + 0.5
    y = (per_table * mask).sum(1).astype(np.float32)
    return feats, mask, y


def test_compute_model_recovers_a_known_linear_cost():
    feats, mask, y = _linear_compute_data()
    model = ComputeCostModel()
    report = model.fit((feats, mask), y, epochs=200, batch_size=64, seed=0, progress=False)
    assert report["test"]["mape"] < 0.05, report["test"]
    assert report["test"]["r2"] > 0.98


def test_comm_model_recovers_a_known_linear_cost():
    rng = np.random.default_rng(1)
    N, n = 4, 1500
    dims = rng.integers(0, 600, (n, N)).astype(np.float32)
    delays = rng.uniform(0, 20, (n, N)).astype(np.float32)
    y = (0.01 * dims + 0.002 * dims.sum(1, keepdims=True) + 0.3 * (delays.max(1, keepdims=True) - delays) + 1)
    model = CommCostModel(N, "fw")
    report = model.fit((np.concatenate([dims, delays], 1),), y.astype(np.float32), epochs=200, batch_size=64,
                       progress=False)
    assert report["test"]["mape"] < 0.05, report["test"]


def test_wait_term_adds_each_ranks_wait_for_the_last_ready_rank_by_hand(tmp_path):
    """fw = MLP + (max delay - delay_r): with the MLP's last layer zeroed to biases 1..4 and delays 0, 5, 2, 9
    the ranks cost 1 + 9, 2 + 4, 3 + 7 and 4 + 0 in the torch and numpy paths and after save / load; the
    paper's model with the same weights gives the biases alone."""
    x = np.array([[100, 200, 300, 400, 0, 5, 2, 9]], np.float64)
    models = {}
    for wait_term in (True, False):
        m = CommCostModel(4, "fw", {"fw_wait_term": wait_term})
        last = m.net.mlp[-1]
        with torch.no_grad():
            last.weight.zero_()
            last.bias.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
        models[wait_term] = m
    assert np.allclose(models[True].predict_np(x), [[10, 6, 10, 4]])
    assert np.allclose(models[True].predict(x), [[10, 6, 10, 4]])
    assert np.allclose(models[False].predict_np(x), [[1, 2, 3, 4]])
    models[True].save(tmp_path / "fw.pt")
    back = CommCostModel.load(tmp_path / "fw.pt")
    assert back.meta["fw_wait_term"] is True and np.allclose(back.predict_np(x), [[10, 6, 10, 4]])
    assert CommCostModel(4, "fw").meta["fw_wait_term"] is False  # saved without the key: the paper's model
    with pytest.raises(UserError, match="only for a forward model"):
        CommCostModel(4, "bw", {"fw_wait_term": True})
    with pytest.raises(UserError, match="true or false"):
        CommCostModel(4, "fw", {"fw_wait_term": "yes"})
    obj = torch.load(tmp_path / "fw.pt", weights_only=True)
    obj["meta"]["fw_wait_term"] = 1
    torch.save(obj, tmp_path / "bad.pt")
    with pytest.raises(UserError, match="bad.pt: fw_wait_term must be true or false.*retrain it"):
        CommCostModel.load(tmp_path / "bad.pt")
    for top in ("abc", [1.0] * 7, [1.0] * 7 + [float("nan")], [True] * 8, {"a": 1}):  # the recorded data range
        obj["meta"].update(fw_wait_term=True, training_input_max=top)
        torch.save(obj, tmp_path / "bad.pt")
        with pytest.raises(UserError, match="bad.pt: training_input_max must be 8 finite numbers"):
            CommCostModel.load(tmp_path / "bad.pt")


def test_wait_term_gets_the_last_ready_rank_right_where_the_paper_model_does_not():
    """All-to-alls where a rank costs its wait for the last-ready rank plus a 2-5 ms transfer (the structure
    measured on CPU ranks, docs/findings.md), spreads up to 100 ms: trained alike, the wait-term model
    predicts the last-ready rank (which waits for nobody) within 10%, the paper's model several times worse."""
    rng = np.random.default_rng(3)
    N, n = 4, 400
    dims = rng.integers(40, 1200, (n, N)).astype(np.float32)
    spread = rng.uniform(1, 100, (n, 1))
    delays = (rng.uniform(0, 1, (n, N)) * spread).astype(np.float32)
    y = 2 + 0.001 * dims + 0.0005 * dims.sum(1, keepdims=True) + (delays.max(1, keepdims=True) - delays)
    x = np.concatenate([dims, delays], 1)
    tr, te = slice(0, 300), slice(300, None)
    last = delays[te] == delays[te].max(1, keepdims=True)
    err = {}
    for wait_term in (False, True):
        m = CommCostModel(N, "fw", {"fw_wait_term": wait_term})
        m.fit((x[tr],), y[tr].astype(np.float32), epochs=300, batch_size=64, seed=0, progress=False)
        pred = m.predict_np(x[te])
        err[wait_term] = float(np.mean(np.abs(pred[last] - y[te][last]) / y[te][last]))
    assert err[True] < 0.10 and err[False] > 3 * err[True], err


def test_fine_tune_fits_a_few_samples_of_other_hardware_and_keeps_the_normalisation():
    """Pre-trained on one machine, fine-tuned on 30 samples of a machine where lookups cost 3x and every
    operator 2 ms more: the error on 300 unseen samples of that machine must fall several-fold."""
    feats, mask, y = _linear_compute_data(800)
    model = ComputeCostModel()
    model.fit((feats, mask), y, epochs=60, batch_size=64, seed=0, progress=False)
    nf, nm, _ = _linear_compute_data(330, seed=5)
    other = (((0.02 * nf[..., 0] + 0.3 * nf[..., 2] + 1e-5 * nf[..., 1] + 0.5) * nm).sum(1) + 2).astype(np.float32)
    tune, test = slice(0, 30), slice(30, None)
    before = regression_metrics(model.predict(nf[test], nm[test]), other[test])["mape"]
    mean = model.net.x_mean.clone()
    report = model.fine_tune((nf[tune], nm[tune]), other[tune], steps=300, lr=1e-3, seed=0)
    after = regression_metrics(model.predict(nf[test], nm[test]), other[test])["mape"]
    assert after < 0.3 * before and after < 0.15, (before, after)
    assert report["mape_after"] < report["mape_before"] and report["samples"] == 30
    assert torch.equal(model.net.x_mean, mean) and model.meta["fine_tune"][-1] == report
    with pytest.raises(ValueError, match="> 0"):
        model.fine_tune((nf[:3], nm[:3]), np.array([1.0, 0.0, 2.0]), steps=1)


def test_save_load_round_trip(tmp_path):
    feats, mask, y = _linear_compute_data(200)
    model = ComputeCostModel({"device": "cpu", "backend": "fbgemm"})
    model.fit((feats, mask), y, epochs=3, progress=False)
    model.save(tmp_path / "c.pt")
    back = ComputeCostModel.load(tmp_path / "c.pt")
    assert np.array_equal(model.predict(feats, mask), back.predict(feats, mask))
    assert back.meta["backend"] == "fbgemm" and "metrics" in back.meta
    comm = CommCostModel(3, "bw", {"device": "cpu"})
    comm.save(tmp_path / "b.pt")
    back = CommCostModel.load(tmp_path / "b.pt")
    x = np.random.default_rng(0).uniform(0, 100, (5, 3))
    assert np.array_equal(comm.predict(x), back.predict(x)) and back.num_devices == 3
    with pytest.raises(UserError, match="not a compute_cost_model"):
        ComputeCostModel.load(tmp_path / "b.pt")


def test_log_input_transform_is_applied_in_every_path(tmp_path):
    """`log` inputs: the normalisation is of log(rows) and log(1 + pooling) (computed by hand here), the
    search's numpy path (embed + head) gives the network's prediction, and the transform survives a reload."""
    feats, mask, y = _linear_compute_data(300)
    model = ComputeCostModel({"input_transform": "log"})
    model.fit((feats, mask), y, epochs=3, progress=False)
    train_split = split_indices(len(y), 0.8, 0.1, 0)[0]  # the normalisation is the training split's
    rows = feats[train_split][mask[train_split].astype(bool)]
    mean = model.net.x_mean.numpy()
    assert np.isclose(mean[1], np.log(rows[:, 1]).mean(), rtol=1e-4)
    assert np.isclose(mean[2], np.log1p(rows[:, 2]).mean(), rtol=1e-4)
    assert np.isclose(mean[0], rows[:, 0].mean(), rtol=1e-4)  # dim and the bins are left as they are
    pred = model.predict(feats[:20], mask[:20])
    by_parts = [model.head(model.embed(f[m.astype(bool)]).sum(0)) for f, m in zip(feats[:20], mask[:20])]
    assert np.allclose(pred, by_parts, rtol=1e-4)
    model.save(tmp_path / "log.pt")
    back = ComputeCostModel.load(tmp_path / "log.pt")
    assert back.input_transform == "log" and np.array_equal(back.predict(feats, mask), model.predict(feats, mask))
    raw = ComputeCostModel()
    raw.fit((feats, mask), y, epochs=3, progress=False)
    assert raw.input_transform == "raw" and np.isclose(raw.net.x_mean.numpy()[1], rows[:, 1].mean(), rtol=1e-4)
    # a file naming an unknown transform is refused in one line that names the file
    obj = torch.load(tmp_path / "log.pt", weights_only=True)
    obj["meta"]["input_transform"] = "sqrt"
    torch.save(obj, tmp_path / "bad.pt")
    with pytest.raises(UserError, match=r"bad\.pt: unknown compute-model input transform 'sqrt'.*retrain"):
        ComputeCostModel.load(tmp_path / "bad.pt")


def test_weights_load_refuses_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"kind": "compute_cost_model", "meta": {}, "state_dict": {}, "x": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(UserError, match="not a loadable"):
        ComputeCostModel.load(tmp_path / "evil.pt")


def test_comm_model_refuses_other_device_count():
    model = CommCostModel(4, "bw")
    with pytest.raises(UserError, match="trained for 4 devices"):
        model.predict(np.zeros((2, 2)))


def test_metrics_by_hand():
    m = regression_metrics(np.array([1.0, 2.0, 4.0]), np.array([1.0, 2.0, 2.0]))
    assert m["mse"] == pytest.approx(4 / 3)
    assert m["mape"] == pytest.approx(1 / 3)
    assert m["spearman"] == pytest.approx(np.corrcoef([1, 2, 3], [1, 2.5, 2.5])[0, 1])


def test_metrics_line_says_when_the_test_split_cannot_rank(capsys):
    """A test split too small to rank (train_*_cost_model.py --num_samples 10) prints n/a and says why, not nan."""
    from neuroshard.models.fitting import _print_metrics
    from neuroshard.models.training_loops import regression_metrics

    def report(pred, target):
        return {"test": regression_metrics(pred, target), "best_valid_mse": 0.5,
                "num_samples": {"train": 8, "valid": 1, "test": len(target)}}

    _print_metrics("compute", report([1.0], [2.0]))
    out = capsys.readouterr().out
    assert "Spearman n/a" in out and "R² n/a" in out and "nan" not in out
    assert "a test split of 1 sample(s) cannot rank" in out and "--num_samples" in out
    _print_metrics("compute", report([1.0, 2.0, 3.5, 3.0], [1.0, 2.0, 3.0, 4.0]))
    out = capsys.readouterr().out
    assert "Spearman 0.8000" in out and "cannot rank" not in out


def test_scripted_pipeline_trains_and_shards(tiny_pipeline, tmp_path, capsys):
    """train -> eval_simulator -> eval with --alg neuroshard, all through the scripts, on the cost data the
    session's tiny pipeline collected (the collector scripts run in tests/hardware/test_hardware.py)."""
    from neuroshard.data.dataset import DLRMDataset
    from neuroshard.data.tasks import generate_tasks, save_tasks
    from neuroshard.hardware.collect import load_cost_data
    from neuroshard.hardware.comm_bench import COMM_DATA_KIND

    dataset = DLRMDataset.load(tiny_pipeline.work / "data/dlrm_datasets")
    cost = tiny_pipeline.work / "data/cost_data"
    common = ["--num_iter", "2", "--warmup_iter", "1"]
    models = tmp_path / "models"
    r = run_script("train_compute_cost_model.py", "--data_dir", cost, "--dataset_dir", dataset.path,
                   "--out_path", models / "compute.pt", "--epochs", "2")
    assert r.returncode == 0, r.stderr
    assert "Spearman" in r.stdout and "MAPE" in r.stdout
    r = run_script("train_comm_cost_model.py", "--data_dir", cost, "--ndevices", "2", "--epochs", "2",
                   "--fw_out_path", models / "fw.pt", "--bw_out_path", models / "bw.pt")
    assert r.returncode == 0, r.stderr
    r = run_script("train_comm_cost_model.py", "--data_dir", cost, "--ndevices", "2", "--epochs", "2",
                   "--fw_wait_term", "--fw_out_path", models / "fw_wait.pt", "--bw_out_path", models / "bw_wait.pt")
    assert r.returncode == 0, r.stderr
    fw, bw = CommCostModel.load(models / "fw_wait.pt"), CommCostModel.load(models / "bw_wait.pt")
    assert fw.meta["fw_wait_term"] is True and bw.meta["fw_wait_term"] is False
    meta, samples = load_cost_data(cost / "comm_cost_data_2.pkl", COMM_DATA_KIND)
    assert fw.meta["sleep_range"] == tuple(meta["sleep_range"]) and CommCostModel.load(models / "fw.pt").meta[
        "fw_wait_term"] is False
    top = [max(s["dim_sums"][r] for s in samples) for r in range(2)] + \
        [max(s["delays_ms"][r] for s in samples) for r in range(2)]  # the data's largest inputs, recorded
    assert fw.meta["training_input_max"] == pytest.approx(top, rel=1e-6)
    assert bw.meta["training_input_max"] == pytest.approx(top[:2], rel=1e-6)
    save_tasks(tmp_path / "t.pkl", generate_tasks(dataset, 3, (3, 7), 0.01, 32, seed=0), dataset)
    m = ["--compute_model", models / "compute.pt", "--fw_comm_model", models / "fw.pt",
         "--bw_comm_model", models / "bw.pt", "--data_dir", dataset.path, "--task_path", tmp_path / "t.pkl",
         "--ndevices", "2", "--max_mem", "0.01"]
    r = run_script("eval_simulator.py", *m, "--alg", "neuroshard,dim_greedy", "--results_csv", tmp_path / "s.csv")
    assert r.returncode == 0, r.stderr
    assert "neuroshard: average cost" in r.stdout and "Valid 3 / 3" in r.stdout
    r = run_script("eval.py", *m, "--alg", "neuroshard", "--results_csv", tmp_path / "e.csv", *common)
    assert r.returncode == 0, r.stderr
    assert "Valid 3 / 3" in r.stdout
    # a baseline-only measurement needs no comm models, even where a compute model exists
    r = run_script("eval.py", "--compute_model", models / "compute.pt", *m[6:], "--alg", "dim_greedy",
                   "--results_csv", tmp_path / "b.csv", *common)
    assert r.returncode == 0, r.stderr
    # models for 2 devices refuse a 4-device run
    refused(capsys, "eval_simulator.py", *m[:-4], "--ndevices", "4", "--max_mem", "0.01", "--alg", "neuroshard",
            untouched=[tmp_path], quiet=False,
            match=re.escape("error: the comm cost models were trained for 2 devices, the task "
                            "asks for 4; collect comm data and train models with --ndevices 4"))
    refused(capsys, "eval_simulator.py", "--data_dir", dataset.path, "--task_path", tmp_path / "t.pkl",
            "--compute_model", tmp_path / "missing.pt", "--alg", "neuroshard", untouched=[tmp_path], cwd=tmp_path,
            match=re.escape(
                f"error: cost models not found: {tmp_path}/missing.pt, models/comm_4_fw.pt, models/comm_4_bw.pt; train "
                "them with `make reproduce` (4 devices) or steps 3-4: python collect_compute_cost_data.py && python "
                "train_compute_cost_model.py && python collect_comm_cost_data.py --ndevices 4 && python "
                "train_comm_cost_model.py --ndevices 4; or pass --compute_model/--fw_comm_model/--bw_comm_model"))


def test_non_finite_weights_are_refused(tmp_path):
    model = ComputeCostModel({"device": "cpu"})
    with torch.no_grad():
        model.net.head[2].weight[0, 0] = float("nan")
    model.save(tmp_path / "nan.pt")
    with pytest.raises(UserError, match="non-finite weights"):
        ComputeCostModel.load(tmp_path / "nan.pt")


def test_wrong_shapes_are_refused(tmp_path):
    torch.save({"kind": "comm_cost_model", "meta": {"ndevices": 4, "direction": "fw"},
                "state_dict": CommCostModel(2, "fw").net.state_dict()}, tmp_path / "x.pt")
    with pytest.raises(UserError, match="does not hold the weights"):
        CommCostModel.load(tmp_path / "x.pt")


def test_models_are_checked_against_each_other_and_the_dataset(tmp_path):
    from neuroshard.sharding.simulator import Simulator

    meta = {"device": "cpu", "batch_size": 256, "dataset_fingerprint": "abc"}
    ComputeCostModel(dict(meta)).save(tmp_path / "c.pt")
    CommCostModel(2, "fw", dict(meta)).save(tmp_path / "fw.pt")
    CommCostModel(2, "bw", dict(meta)).save(tmp_path / "bw.pt")
    CommCostModel(3, "bw", dict(meta)).save(tmp_path / "bw3.pt")
    CommCostModel(2, "bw", {**meta, "batch_size": 512}).save(tmp_path / "bw512.pt")
    with pytest.raises(UserError, match="is the backward comm model"):
        Simulator.load(tmp_path / "c.pt", tmp_path / "bw.pt", tmp_path / "bw.pt")
    with pytest.raises(UserError, match="is the forward comm model"):
        Simulator.load(tmp_path / "c.pt", tmp_path / "fw.pt", tmp_path / "fw.pt")
    with pytest.raises(UserError, match="forward comm model is for 2 devices, backward for 3"):
        Simulator.load(tmp_path / "c.pt", tmp_path / "fw.pt", tmp_path / "bw3.pt")
    with pytest.raises(UserError, match="different batch sizes"):
        Simulator.load(tmp_path / "c.pt", tmp_path / "fw.pt", tmp_path / "bw512.pt")
    sim = Simulator.load(tmp_path / "c.pt", tmp_path / "fw.pt", tmp_path / "bw.pt")
    sim.check_dataset("abc", 256)
    with pytest.raises(UserError, match="another dataset"):
        sim.check_dataset("other", 256)
    with pytest.raises(UserError, match="trained at batch 256"):
        sim.check_dataset("abc", 128)


def test_a_cost_model_path_that_is_not_a_file_is_named_as_such(tmp_path):
    """Every caller (NeuroShardPlanner, eval, shard_tables) loads through CostModel.load: a folder or a device
    in a model's place gets a line saying so, not "not found"."""
    (tmp_path / "compute.pt").mkdir()
    with pytest.raises(UserError, match=r"cost model .*compute.pt is a folder, not a file; train it with "
                                        "train_compute_cost_model.py"):
        ComputeCostModel.load(tmp_path / "compute.pt")
    with pytest.raises(UserError, match="cost model /dev/zero is a character device"):
        CommCostModel.load("/dev/zero")


def test_from_files_is_the_one_loader(tmp_path):
    """`Simulator.from_files` takes a models folder or the files a run's flags name: the default names for N
    devices, the input-distribution model where one lies beside the backward model, all missing files in one line
    (or None when the models are optional), a folder in a model's place named as such."""
    from neuroshard.core.config import CostModelFiles
    from neuroshard.sharding.simulator import Simulator

    meta = {"device": "cpu", "batch_size": 256}
    ComputeCostModel(dict(meta)).save(tmp_path / "compute.pt")
    CommCostModel(2, "fw", dict(meta)).save(tmp_path / "comm_2_fw.pt")
    CommCostModel(2, "bw", dict(meta)).save(tmp_path / "comm_2_bw.pt")
    sim = Simulator.from_files(tmp_path, 2)
    assert sim.num_devices == 2 and sim.inp is None and sim.cost == "paper"
    CommCostModel(2, "input", dict(meta)).save(tmp_path / "comm_2_input.pt")
    named = CostModelFiles(str(tmp_path / "compute.pt"), str(tmp_path / "comm_2_fw.pt"), str(tmp_path / "comm_2_bw.pt"))
    assert Simulator.from_files(named, 2).inp is not None  # found beside the backward model
    assert Simulator.from_files(tmp_path / "none", 2, required=False) is None
    with pytest.raises(UserError, match=r"^cost models not found: .*none/compute.pt, .*none/comm_2_fw.pt, "
                                        r".*none/comm_2_bw.pt; train them with"):
        Simulator.from_files(tmp_path / "none", 2)
    with pytest.raises(UserError, match="trained for 2 devices, the task asks for 4"):
        Simulator.from_files(named, 4)
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "compute.pt").mkdir()
    for name in ("comm_2_fw.pt", "comm_2_bw.pt"):
        (tmp_path / "dir" / name).write_bytes((tmp_path / name).read_bytes())
    with pytest.raises(UserError, match="compute.pt is a folder, not a file"):
        Simulator.from_files(tmp_path / "dir", 2)
