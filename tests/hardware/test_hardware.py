"""Real measurements on tiny tables: compute benchmark, backends, all-to-all, measurement engine, collectors."""
import csv
import os
import re
import signal
import stat
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from neuroshard.core.errors import UserError
from neuroshard.hardware.backends import FbgemmTBE, TorchFusedEmbeddingBag, fbgemm_works, resolve_hardware
from neuroshard.core.artifacts import read_record_log
from neuroshard.hardware.collect import load_cost_data, missing_indices
from neuroshard.hardware.comm_bench import COMM_DATA_KIND
from neuroshard.hardware.compute_bench import COMPUTE_DATA_KIND, ComputeBenchmark, ShardView
from neuroshard.data.dataset import process_raw
from neuroshard.data.tasks import ShardingTask
from neuroshard.sharding.plan import Placement, Shard

from conftest import ROOT, popen_interruptible, refused, run_python, run_script

HW = resolve_hardware("cpu", "auto")


def _raw(pfs, rows, B, seed=0):
    """Raw dataset with constant per-table pooling factors and uniform ids."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(pfs, dtype=torch.int64)[:, None].repeat(1, B)
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths.reshape(-1), 0)
    ids = torch.cat([torch.randint(0, r, (int(l.sum()),), generator=g) for r, l in zip(rows, lengths)])
    return ids, offsets, lengths


@pytest.fixture(scope="module")
def bench_dataset(tmp_path_factory):
    # tables 0..11: pooling 2, table 12: pooling 60; all 20,000 rows
    pfs = [2] * 12 + [60]
    return process_raw(*_raw(pfs, [20000] * 13, 2048), out_dir=tmp_path_factory.mktemp("bench"),
                       source={"source": "test"}, progress=False)


def test_compute_benchmark_times_the_shard_it_is_given(bench_dataset):
    """A measurement is a finite positive time of the given shard's lookups. How the cost grows with pooling,
    dim and tables is this machine's speed, not behaviour: benchmarks/compute_cost_scaling.py measures it."""
    torch.set_num_threads(1)
    bench = ComputeBenchmark(bench_dataset, HW, 256, warmup_iter=1, num_iter=2)
    for tables, dims in (([0], [64]), ([12], [4]), (list(range(12)), [32] * 12)):
        ms = bench.measure(tables, dims)
        assert np.isfinite(ms) and ms > 0, (tables, ms)
    ids, offsets = bench.inputs([0, 12])  # the shard's own ids: 256 samples of pooling 2 and 60
    assert offsets[-1] == ids.numel() == 256 * (2 + 60)


def test_a_row_block_reads_the_ids_in_its_rows_and_a_replica_its_local_batch(bench_dataset):
    """A `ShardView` of a table (the emulated engine's row blocks and data-parallel replicas): a row block's bags
    hold exactly the table's ids in its rows, renumbered from 0, sample by sample; a replica's are the samples of
    its rank's slice of the batch alone (B / world bags); the operator of a block has the block's rows, an operator of
    replicas runs at the local batch, and either measures; replicas and other shards in one operator are refused."""
    from neuroshard.hardware.compute_bench import view_rows

    bench = ComputeBenchmark(bench_dataset, HW, 256, warmup_iter=1, num_iter=2)
    ids, offsets = bench.inputs([12])
    whole = [ids[offsets[b]:offsets[b + 1]] for b in range(256)]
    for lo, rows in ((0, 5000), (15000, 5000), (19000, 4000)):  # TorchRec's last blocks may run past the rows
        got, off = bench.inputs([12], [ShardView(lo, rows)])
        assert off.shape == (257,) and int(off[-1]) == got.numel()
        for b in range(256):
            want = whole[b][(whole[b] >= lo) & (whole[b] < lo + rows)] - lo
            assert torch.equal(got[off[b]:off[b + 1]], want), (lo, b)
        assert 0 < got.numel() < ids.numel() and int(got.max()) < view_rows(20000, ShardView(lo, rows))
    assert view_rows(20000, ShardView(19000, 4000)) == 1000 and view_rows(20000, None) == 20000
    assert view_rows(20000, ShardView(20000, 4000)) == 1  # a block of no rows: an operator of one row, no ids
    got, off = bench.inputs([12], [ShardView(replica=1, world=4)])  # the local batch: samples 64-127 alone
    assert off.shape == (65,) and (torch.diff(off) == 60).all() and torch.equal(got, ids[offsets[64]:offsets[128]])
    got, off = bench.inputs([12, 3], [ShardView(replica=3, world=4)] * 2)
    assert off.shape == (129,) and int(off[64]) == int(offsets[256] - offsets[192])
    ms = bench.measure([12, 0, 12], [16, 8, 16], [ShardView(0, 5000), None, ShardView(0, 5000)])
    local = bench.measure([12, 0], [16, 8], [ShardView(replica=0, world=4)] * 2)  # an operator at batch 64
    assert np.isfinite(ms) and ms > 0 and np.isfinite(local) and local > 0
    with pytest.raises(ValueError, match="one operator runs at one batch"):  # replicas with other shards
        bench.measure([12, 0], [16, 8], [ShardView(replica=0, world=4), None])


@pytest.mark.skipif(not fbgemm_works("cpu"), reason="fbgemm-gpu-cpu not installed")
def test_fbgemm_and_torch_backends_agree(bench_dataset):
    specs = [(20000, 16), (20000, 8), (20000, 16), (20000, 4)]
    bench = ComputeBenchmark(bench_dataset, HW, 64, flush=False)
    ids, offsets = bench.inputs([0, 1, 12, 3])
    fb, pt = FbgemmTBE(specs, "cpu"), TorchFusedEmbeddingBag(specs, "cpu")
    with torch.no_grad():
        for a, b in zip(fb.weights(), pt.weights()):
            a.copy_(b)
    pf, pp = fb.prepare(ids, offsets), pt.prepare(ids, offsets)
    out_fb, out_pt = fb.forward(pf), pt.forward(pp)
    assert out_fb.shape == (64, 44)
    assert torch.allclose(out_fb, out_pt, atol=1e-5)
    grad = torch.randn_like(out_fb)
    fb.train_step(pf, grad)
    pt.train_step(pp, grad)
    for a, b in zip(fb.weights(), pt.weights()):
        assert torch.allclose(a, b, atol=1e-5)


def _layouts(world, layouts, batch=1024, warmup=2, iters=5):
    from neuroshard.hardware.engine import EngineSettings, Layout, measure_fixed

    items = [Layout(tuple(d), tuple(w)) for d, w in layouts]
    measured = measure_fixed(EngineSettings(None, resolve_hardware("cpu", "auto"), batch, warmup, iters), items, world)
    return [(m.fw_ms, m.bw_ms) for m in measured]


@pytest.mark.parametrize("world", [2, 4])
def test_all_to_all_runs_and_straggler_delay_is_not_counted(world):
    dims = [64] * world
    delays = [0.0] * world
    delays[-1] = 20.0  # the last rank arrives 20 ms late
    (fw0, bw0), (fw1, bw1) = _layouts(world, [(dims, [0.0] * world), (dims, delays)])
    for x in (fw0, bw0, fw1, bw1):
        assert np.all(np.isfinite(x)) and np.all(x > 0)
    # the others wait for the straggler's 20 ms (a sleep: no machine is faster than it) ...
    assert np.all(fw1[:-1] > 10), fw1
    # ... and the straggler does not pay its own delay: it waits less than every rank that waited for it
    assert fw1[-1] < fw1[:-1].min(), (fw0, fw1)


def test_rank_failure_is_reported():
    with pytest.raises(UserError, match="rank"):
        _layouts(2, [([64, 64, 64], [0.0, 0.0, 0.0])])  # 3 dim sums on 2 ranks: the ranks fail


def test_eval_measures_every_baseline(small_dataset, tmp_path):
    from neuroshard.data.tasks import save_tasks

    tasks = [{"table_ids": np.array([0, 1, 2, 3, 4]), "dims": np.array([8, 16, 32, 4, 8])},
             {"table_ids": np.array([5, 6, 7, 8]), "dims": np.array([16, 16, 4, 8])}]
    save_tasks(tmp_path / "t.pkl", tasks, small_dataset)
    csv_path = tmp_path / "eval.csv"
    proc = run_script("eval.py", "--data_dir", small_dataset.path, "--task_path", tmp_path / "t.pkl",
                      "--alg", "random,dim_greedy,size_greedy,lookup_greedy,size_lookup_greedy",
                      "--ndevices", "2", "--max_mem", "1", "--warmup_iter", "1", "--num_iter", "3",
                      "--results_csv", csv_path)
    assert proc.returncode == 0, proc.stderr
    assert "Valid 2 / 2" in proc.stdout
    rows = list(csv.DictReader(open(csv_path)))
    assert len(rows) == 10
    for r in rows:
        for key in ("compute_ms", "fw_ms", "bw_ms"):
            vals = [float(x) for x in r[key].split(";")]
            assert len(vals) == 2 and all(np.isfinite(v) for v in vals)
        assert all(float(x) > 0 for x in r["fw_ms"].split(";") + r["bw_ms"].split(";"))
        assert float(r["cost_ms"]) > 0
    assert (tmp_path / "eval.csv.meta.json").exists()


def test_eval_bad_input(small_dataset, tmp_path, capsys):
    from neuroshard.data.tasks import save_tasks

    save_tasks(tmp_path / "t.pkl", [{"table_ids": np.array([0, 1, 2]), "dims": np.array([8, 8, 8])}], small_dataset)
    base = ["--data_dir", small_dataset.path, "--task_path", tmp_path / "t.pkl", "--num_iter", "1",
            "--results_csv", tmp_path / "r.csv"]
    cases = [(["--alg", "nope"], "unknown --alg 'nope'; choose one of random, dim_greedy, size_greedy, lookup_greedy, "
                                 "size_lookup_greedy, neuroshard, neuroshard_risk, torchrec, all, or plan:FILE"),
             (["--alg", "random", "--ndevices", "4"],
              f"4 devices but a task in {tmp_path}/t.pkl has only 3 tables; use fewer --ndevices or larger tasks"),
             (["--alg", "random", "--batch_size", "100000"], "--batch_size must be >= 1 and <= 256, got 100000")]
    if not torch.cuda.is_available():
        cases.append((["--alg", "random", "--gpu_devices", "0"],
                      "--gpu_devices 0 given but CUDA is not available here; drop --gpu_devices to run on CPU"))
    for args, line in cases:
        refused(capsys, "eval.py", *base, *args, match=re.escape(f"error: {line}"), untouched=[tmp_path])
    refused(capsys, "eval.py", "--data_dir", tmp_path, "--alg", "random", "--results_csv", tmp_path / "r.csv",
            untouched=[tmp_path], match=re.escape(f"error: {tmp_path} is not a processed DLRM dataset (no tables.pkl / "
                                                  "indices.pt); run tools/gen_dlrm_data.py first"))
    other = process_raw(*_raw([1, 2, 3], [100] * 3, 8), tmp_path / "other", {"source": "t"}, progress=False)
    refused(capsys, "eval.py", "--data_dir", other.path, "--task_path", tmp_path / "t.pkl", "--alg", "random",
            "--results_csv", tmp_path / "r.csv", untouched=[tmp_path],
            match=re.escape(f"error: {tmp_path}/t.pkl was made from another dataset than {other.path}; regenerate it "
                            f"with tools/gen_tasks.py --data_dir {other.path}"))


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _interrupt_after(args, path, kind, min_samples, extra_wait_s=0.0):
    """Start a collector, Ctrl-C it (SIGINT to its process group) once `path` holds `min_samples`."""
    proc = popen_interruptible(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while time.time() < deadline:
        if path.exists() and len(read_record_log(path, kind, "x")[1]) >= min_samples:
            break
        time.sleep(0.2)
    time.sleep(extra_wait_s)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal reaches the whole process group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    deadline = time.time() + 20
    while _group_alive(proc.pid) and time.time() < deadline:
        time.sleep(0.2)
    assert not _group_alive(proc.pid), "worker processes left behind"
    return err


def test_missing_indices_fill_holes():
    records = [{"index": i} for i in (0, 1, 3, 7, 12)]
    assert missing_indices(records, 10) == [2, 4, 5, 6, 8, 9]
    assert missing_indices(records, 2) == []


@pytest.mark.parametrize("extra_wait_s", [0.0, 0.7])
def test_compute_collection_interrupt_and_resume(small_dataset, tmp_path, capsys, extra_wait_s):
    out = tmp_path / "cc"
    args = [sys.executable, str(ROOT / "collect_compute_cost_data.py"), "--dataset_dir", str(small_dataset.path),
            "--out_dir", str(out), "--max_tables", "5", "--max_mem", "0.01", "--workers", "2", "--num_iter", "2",
            "--warmup_iter", "1"]
    path = out / "compute_cost_data.pkl"
    err = _interrupt_after(args + ["--data_size", "100000"], path, COMPUTE_DATA_KIND, 3, extra_wait_s)
    assert "finished work is saved" in err
    saved = load_cost_data(path, COMPUTE_DATA_KIND)[1]
    assert len(saved) >= 3 and all(s["cost_ms"] > 0 for s in saved)
    # resume: exactly the missing indices are measured, so the file holds 0..target-1 with no holes
    target = max(s["index"] for s in saved) + 4
    done = run_python(*args[1:], "--data_size", target, timeout=300)
    assert done.returncode == 0, done.stderr
    meta, samples = load_cost_data(path, COMPUTE_DATA_KIND)
    assert [s["index"] for s in samples] == list(range(target))
    assert meta["max_tables"] == 5 and all(1 <= len(s["table_ids"]) <= 5 for s in samples)
    # a run with other settings refuses to mix into the file, and leaves it as it was
    refused(capsys, "collect_compute_cost_data.py", *args[2:-6], "--max_mem", "0.02", "--data_size", "5",
            untouched=[tmp_path], quiet=False,
            match=re.escape(f"error: {path} holds records made with max_mem_gb=0.01, this run has max_mem_gb=0.02; use "
                            "another output path to keep them apart, or delete the file to start over"))
    assert len(load_cost_data(path, COMPUTE_DATA_KIND)[1]) == target


def test_second_collector_on_one_file_is_refused(small_dataset, tmp_path, capsys):
    from neuroshard.core.artifacts import RecordLog

    path = tmp_path / "compute_cost_data.pkl"
    with RecordLog(path, COMPUTE_DATA_KIND, {}, ()):  # another collector holds the file
        refused(capsys, "collect_compute_cost_data.py", "--dataset_dir", small_dataset.path, "--out_dir", tmp_path,
                "--max_mem", "0.01", "--data_size", "2", untouched=[tmp_path], quiet=False,
                match=re.escape(f"error: {path} is being written by another process; wait for it to finish or choose "
                                "another output folder"))


def test_comm_collection_interrupt_and_resume(tmp_path):
    args = [sys.executable, str(ROOT / "collect_comm_cost_data.py"), "--out_dir", str(tmp_path), "--ndevices", "2",
            "--batch_size", "512", "--T_range", "3,6", "--sleep_range", "1,3", "--num_iter", "2", "--warmup_iter", "1"]
    path = tmp_path / "comm_cost_data_2.pkl"
    _interrupt_after(args + ["--data_size", "100000"], path, COMM_DATA_KIND, 2, 0.3)
    saved = load_cost_data(path, COMM_DATA_KIND)[1]
    target = max(s["index"] for s in saved) + 3
    done = run_python(*args[1:], "--data_size", target, timeout=300)
    assert done.returncode == 0, done.stderr
    assert [s["index"] for s in load_cost_data(path, COMM_DATA_KIND)[1]] == list(range(target))


def test_comm_collection(tmp_path, capsys):
    proc = run_script("collect_comm_cost_data.py", "--out_dir", tmp_path, "--ndevices", "2", "--data_size", "3",
                      "--batch_size", "512", "--T_range", "3,6", "--sleep_range", "1,3", "--num_iter", "2",
                      "--warmup_iter", "1")
    assert proc.returncode == 0, proc.stderr
    meta, samples = load_cost_data(tmp_path / "comm_cost_data_2.pkl", "neuroshard.comm_cost_data")
    assert len(samples) == 3 and tuple(meta["sleep_range"]) == (1.0, 3.0)
    for s in samples:
        assert s["fw_ms"].shape == (2,) and np.all(s["bw_ms"] > 0) and s["delays_ms"].min() == 0
    refused(capsys, "collect_comm_cost_data.py", "--ndevices", "3", "--batch_size", "512", "--out_dir", tmp_path,
            match=re.escape("error: --batch_size 512 is not divisible by 3 ranks; use a multiple of 3"),
            untouched=[tmp_path])


def test_input_distribution_collection_and_model(tmp_path, capsys):
    """TorchRec's own KJTAllToAll measured on 2 gloo ranks, a model of it trained, and its bad inputs refused."""
    from neuroshard.core.artifacts import RecordLog
    from neuroshard.data.features import input_words
    from neuroshard.models.cost_models import CommCostModel

    args = ("--out_dir", tmp_path, "--ndevices", "2", "--batch_size", "512", "--T_range", "2,8", "--num_iter", "2",
            "--warmup_iter", "1", "--input_dist")
    proc = run_script("collect_comm_cost_data.py", *args, "--data_size", "12")
    assert proc.returncode == 0, proc.stderr
    meta, samples = load_cost_data(tmp_path / "comm_cost_data_2_input.pkl", COMM_DATA_KIND)
    assert len(samples) == 12 and meta["input_dist"] is True
    for s in samples:  # every rank receives at least one feature; its words are 2 x pooling + 2 per feature
        assert len(s["pooling"]) == 2 and all(len(r) >= 1 for r in s["pooling"])
        assert s["input_words"] == [float(input_words(r).sum()) for r in s["pooling"]]
        assert s["input_ms"].shape == (2,) and np.all(s["input_ms"] > 0)
    assert not (tmp_path / "comm_cost_data_2.pkl").exists()  # the pooled all-to-all's file is another one
    assert "max_dim" not in meta and "sleep_range" not in meta  # input samples never use them
    # resuming ignores the settings input samples do not use, and refuses one they do
    proc = run_script("collect_comm_cost_data.py", *args, "--data_size", "13", "--max_dim", "64",
                      "--sleep_range", "0,5")
    assert proc.returncode == 0, proc.stderr
    _, more = load_cost_data(tmp_path / "comm_cost_data_2_input.pkl", COMM_DATA_KIND)
    assert len(more) == 13 and [s["pooling"] for s in more[:12]] == [s["pooling"] for s in samples]
    other_T = [a if a != "2,8" else "2,9" for a in args]
    refused(capsys, "collect_comm_cost_data.py", *other_T, "--data_size", "14", untouched=[tmp_path], quiet=False,
            match=re.escape(f"error: {tmp_path}/comm_cost_data_2_input.pkl holds records made with T_range=(2, 8), "
                            "this run has T_range=(2, 9); use another output path to keep them apart, or delete the "
                            "file to start over"))
    out = tmp_path / "in.pt"
    train = ("--data_dir", tmp_path, "--ndevices", "2", "--input_dist", "--input_out_path", out, "--epochs", "5")
    proc = run_script("train_comm_cost_model.py", *train)
    assert proc.returncode == 0, proc.stderr
    model = CommCostModel.load_direction(out, "input")
    assert model.num_devices == 2 and model.meta["batch_size"] == 512
    with pytest.raises(UserError, match="input-distribution comm model, but the backward one"):
        CommCostModel.load_direction(out, "bw")
    # DCT-MP does not compress ids; the forward model's wait term has no place here
    refused(capsys, "collect_comm_cost_data.py", *args, "--mp_keep", "0.1", untouched=[tmp_path],
            match=re.escape("error: --input_dist measures TorchRec's input distribution, which DCT-MP does not "
                            "compress; drop --mp_keep (one input-distribution model serves every --mp_keep)"))
    refused(capsys, "train_comm_cost_model.py", *train, "--fw_wait_term", untouched=[tmp_path],
            match=re.escape("error: --fw_wait_term is for the forward model; drop it with --input_dist"))
    # pooled all-to-all samples under the input file's name, and damaged input samples, are refused in one line
    # and leave the trained model as it was
    saved = out.read_bytes()
    other = tmp_path / "other"
    header = {"ndevices": 2, "device": "cpu", "batch_size": 512}
    bad = RecordLog(other / "comm_cost_data_2_input.pkl", COMM_DATA_KIND, header)
    for i in range(12):
        bad.append({"index": i, "dim_sums": np.ones(2), "bw_ms": np.ones(2)})
    bad.close()
    bad_train = ("--data_dir", other, *train[2:])
    refused(capsys, "train_comm_cost_model.py", *bad_train, untouched=[tmp_path],
            match=re.escape(f"error: {other}/comm_cost_data_2_input.pkl does not hold 2-device input-distribution "
                            "samples; collect them with collect_comm_cost_data.py --input_dist --ndevices 2"))
    (other / "comm_cost_data_2_input.pkl").unlink()
    bad = RecordLog(other / "comm_cost_data_2_input.pkl", COMM_DATA_KIND, {**header, "input_dist": True})
    for i in range(12):
        bad.append({"index": i, "input_words": [4.0, 6.0], "input_ms": np.array([1.0, -1.0 if i == 5 else 2.0])})
    bad.close()
    damaged = ("holds damaged input-distribution samples (each needs 2 input words in (0, 1e+08] and 2 plausible ms); "
               "delete it and collect again")
    refused(capsys, "train_comm_cost_model.py", *bad_train, untouched=[tmp_path],
            match=re.escape(f"error: {other}/comm_cost_data_2_input.pkl {damaged}"))
    # forged values the collector never writes: bools or strings for numbers, absurd ms or words
    for i, rec in enumerate(({"input_words": [True, True], "input_ms": [1.0, 2.0]},
                             {"input_words": ["4", "6"], "input_ms": [1.0, 2.0]},
                             {"input_words": [4.0, 6.0], "input_ms": [1e37, 2.0]},
                             {"input_words": [1e30, 6.0], "input_ms": [1.0, 2.0]})):
        path = other / f"f{i}" / "comm_cost_data_2_input.pkl"
        with RecordLog(path, COMM_DATA_KIND, {**header, "input_dist": True}) as log:
            for j in range(12):
                log.append({"index": j, "input_words": [4.0, 6.0], "input_ms": [1.0, 2.0], **(rec if j == 3 else {})})
        refused(capsys, "train_comm_cost_model.py", "--data_dir", path.parent, *train[2:], untouched=[tmp_path],
                match=re.escape(f"error: {path} {damaged}"))
    # records without an index or with one index twice; a forged header
    indices = "record(s) without a valid index or with an index held twice, which the collector never writes"
    for name, recs, head, want in (
            ("dup", [0] * 12, header,
             f"holds 11 {indices}; rerun with --salvage to keep the 1 good ones, or delete the file"),
            ("noindex", [None] + list(range(11)), header,
             f"holds 1 {indices}; rerun with --salvage to keep the 11 good ones, or delete the file"),
            ("head", list(range(12)), {**header, "batch_size": "abc"},
             "has a damaged header (batch 'abc', device 'cpu'); delete it and collect again")):
        path = other / name / "comm_cost_data_2_input.pkl"
        with RecordLog(path, COMM_DATA_KIND, {**head, "input_dist": True}) as log:
            for j in recs:
                log.append({**({} if j is None else {"index": j}), "input_words": [4.0, 6.0], "input_ms": [1.0, 2.0]})
        refused(capsys, "train_comm_cost_model.py", "--data_dir", path.parent, *train[2:], untouched=[tmp_path],
                match=re.escape(f"error: {path} {want}"))
    # the collector refuses to continue a file holding an index twice (its own file, one record appended)
    dup = other / "collected" / "comm_cost_data_2_input.pkl"
    dup.parent.mkdir()
    dup.write_bytes((tmp_path / "comm_cost_data_2_input.pkl").read_bytes())
    with RecordLog(dup, COMM_DATA_KIND, meta) as log:
        log.append({**samples[0]})
    refused(capsys, "collect_comm_cost_data.py", *args[2:], "--out_dir", dup.parent, "--data_size", "13",
            untouched=[tmp_path], quiet=False, match=re.escape(
                f"error: {dup} holds 1 {indices}; rerun with --salvage to keep the 13 good ones, or delete the file"))
    assert out.read_bytes() == saved
    # an empty output path, the data file itself, or a FIFO as the output: refused, nothing replaced
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    data = tmp_path / "comm_cost_data_2_input.pkl"
    before = data.read_bytes()
    for where, want in (("", "--input_out_path is empty; name a file, or leave the flag out for its default"),
                        (data, f"--input_out_path {data} is also the input the input-distribution cost data; writing "
                               "it would replace what this run reads: choose another --input_out_path"),
                        (fifo, f"--input_out_path {fifo} is a FIFO (named pipe), not a file to write; choose another "
                               "--input_out_path")):
        refused(capsys, "train_comm_cost_model.py", *train[:5], "--input_out_path", where, "--epochs", "5",
                match=re.escape(f"error: {want}"), untouched=[tmp_path])
    assert data.read_bytes() == before and stat.S_ISFIFO(os.stat(fifo).st_mode)
    # Ctrl-C while training: exit 130, says nothing was written, and the model is as it was
    with open(tmp_path / "err.txt", "w") as err:
        proc = popen_interruptible([sys.executable, str(ROOT / "train_comm_cost_model.py"),
                                    *map(str, train[:-1]), "1000000"], stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.time() + 120
        while time.time() < deadline and "train comm_cost_model" not in (tmp_path / "err.txt").read_text():
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    assert "interrupted: nothing was written" in (tmp_path / "err.txt").read_text()
    assert out.read_bytes() == saved


def test_interleaved_rounds_report_the_geometric_mean_of_the_rounds(small_dataset):
    from neuroshard.hardware.engine import EngineSettings, measure_plans

    plans = {("a", 0): [[(0, 8)], [(1, 16)]], ("b", 0): [[(0, 8), (1, 16)], []], ("a", 1): [[(2, 4)], [(3, 4)]]}
    got = {}
    measure_plans(EngineSettings(str(small_dataset.path), HW, 256, 1, 2, shuffle=False), plans, 2, rounds=3,
                  group_of=lambda k: k[1], on_result=lambda key, m: got.__setitem__(key, m))
    assert set(got) == set(plans)
    for key, m in got.items():
        rounds = m.round_ms
        assert len(rounds) == 3 and all(r > 0 for r in rounds)
        assert m.cost_ms == pytest.approx(float(np.exp(np.log(rounds).mean())))  # the geometric mean of the rounds
        lo, hi = m.interval()
        assert lo <= m.cost_ms <= hi
        assert m.compute_ms == pytest.approx(np.median([p[:, 0] for p in m.round_parts_ms], axis=0))
    assert got[("b", 0)].compute_ms[1] == 0.0                     # an empty device computes nothing


STEP_TASK = ShardingTask(np.array([7, 8, 9]), np.array([16, 16, 8]),
                         np.column_stack([np.zeros(3), [1.0, 3.0, 20.0], np.zeros((3, 17))]))  # pooling 1, 3, 20
STEP_SPLIT = Placement(2, [Shard(0, 0, 8), Shard(0, 8, 8), Shard(1, 0, 16), Shard(2, 0, 8)], [0, 1, 0, 1], [0])
STEP_WHOLE = Placement(2, [Shard(0, 0, 16), Shard(1, 0, 16), Shard(2, 0, 8)], [0, 0, 1])
STEP_COMPUTE_MS = (5.0, 3.0)  # each rank's compute ms handed to the emulated step
# table 7 in two row blocks (pooling 2 and 1 in them), 8 whole, 9 replicated: groups 0, 2 and 3; without table 8,
# the row-wise group's reduce-scatter is the first forward
STEP_ROW_TASK = ShardingTask(np.array([7, 7, 8, 9, 9]), np.array([8, 8, 16, 4, 4]),
                             np.column_stack([[50.0, 50.0, 100.0, 30.0, 30.0], [2.0, 1.0, 3.0, 0.5, 0.5],
                                              np.zeros((5, 17))]),
                             num_rows=np.array([50, 50, 100, 30, 30]), row_block=np.array([0, 1, -1, -1, -1]),
                             replica=np.array([-1, -1, -1, 0, 1]))
STEP_ROWS = Placement(2, [Shard(t, 0, int(STEP_ROW_TASK.dims[t])) for t in range(5)], [0, 1, 0, 0, 1])
STEP_ROWS_ONLY = Placement(2, [Shard(t, 0, int(STEP_ROW_TASK.dims[t])) for t in (0, 1, 3, 4)], [0, 1, 0, 1])


@pytest.fixture(scope="module")
def gloo_steps(small_dataset):
    """One pair of gloo ranks runs both engine steps for real (`step_workers.steps`; starting ranks that import
    TorchRec is most of the cost): the engine's rounds of TorchRec's DistributedModelParallel step, its builds
    counted (3 rounds of 2 plans, for rebuild_every 1, 0 and 2), and the emulated step's collectives of
    `STEP_SPLIT` and `STEP_WHOLE`, spied on. {"dmp": {(rank, every): (built plan indices, rank 0's rounds)},
    "emulated": {rank: [(parts, calls) per item]}}."""
    pytest.importorskip("torchrec")
    from neuroshard.hardware.dmp_step import TorchRecItem
    from neuroshard.hardware.engine import plan_step_item
    from neuroshard.hardware.launch import run_processes
    from neuroshard.sharding.torchrec_export import plan_spec

    import step_workers

    rows, dims = small_dataset.rows[[0, 1]], np.array([16, 8])
    plans = (Placement(2, [Shard(0, 0, 16), Shard(1, 0, 8)], [0, 1]),  # a table per rank
             Placement(2, [Shard(0, 0, 8), Shard(0, 8, 8), Shard(1, 0, 8)], [0, 1, 0], [0]))  # a column split
    dmp_items = [TorchRecItem.of(plan_spec(["a", "b"], rows, dims, p), [0, 1]) for p in plans]
    step_items = [plan_step_item(STEP_TASK, STEP_SPLIT), plan_step_item(STEP_TASK, STEP_WHOLE),
                  plan_step_item(STEP_ROW_TASK, STEP_ROWS), plan_step_item(STEP_ROW_TASK, STEP_ROWS_ONLY)]
    got = {"dmp": {}, "emulated": {}}

    def on_message(msg):
        kind, m = msg
        if kind == "dmp":
            got["dmp"][m[:2]] = m[2:]
        else:
            got["emulated"][m[0]] = m[1]

    run_processes(step_workers.steps, 2, ((str(small_dataset.path), dmp_items, 8, 3, (1, 0, 2)),
                                          (step_items, STEP_COMPUTE_MS, 4)), on_message, group_device="cpu")
    return got


def test_the_torchrec_step_builds_each_plan_again_every_rebuild_every_measurements(gloo_steps):
    """A build carries an offset through its rounds, so `--measure`'s TorchRec engine (REBUILD_EVERY = 1) builds
    every plan again each round; with 0 each plan is built once, with 2 every other round. Counted on two gloo
    ranks running the engine's own rounds of TorchRec's real DistributedModelParallel step (`gloo_steps`)."""
    from collections import Counter

    got = gloo_steps["dmp"]
    for every, per_item in ((1, 3), (0, 1), (2, 2)):  # 3 rounds of 2 plans: 6, 2 and 4 builds per rank
        for rank in (0, 1):
            builds, _ = got[rank, every]
            assert Counter(builds) == {0: per_item, 1: per_item}, (rank, every, builds)
        rounds = np.array(got[0, every][1])  # [round, plan, rank, part]: each rank's median step, whole
        assert rounds.shape == (3, 2, 2, 3) and np.isfinite(rounds).all(), every
        assert (rounds[..., 0] > 0).all() and (rounds[..., 1:] == 0).all(), every
    assert got[1, 0][1] == []  # only rank 0 reports the rounds


def test_a_step_plan_item_puts_each_shard_in_the_sharding_group_the_step_cost_prices():
    """The emulated engine's step item (`cost="step"`): per device its shards' (table id, dim, sharding group,
    pooling factor, first row, rows, replica), group 0 table-wise, 1 column-wise, 4 table-column-wise, 2 row-wise
    (each block its rows of the table, in rank order), 3 data-parallel (the replica's rank; its rows, whose gradient
    it all-reduces); a whole table TorchRec must shard column-wise is in the column-wise group. The paper's cost has
    no row blocks or replicas: refused in one line."""
    from neuroshard.hardware.engine import StepShard, plan_device_tables, plan_step_item

    item = plan_step_item(STEP_TASK, STEP_SPLIT)
    assert item.devices == (((7, 8, 1, 1.0, 0, 0, -1), (8, 16, 0, 3.0, 0, 0, -1)),
                            ((7, 8, 1, 1.0, 0, 0, -1), (9, 8, 0, 20.0, 0, 0, -1)))
    assert item.group(0) == ([16, 8], [[3.0], [20.0]]) and item.group(1) == ([8, 8], [[1.0], [1.0]])
    assert plan_step_item(STEP_TASK, STEP_WHOLE).group(1) == ([0, 0], [[], []])
    forced = replace(STEP_TASK, column_wise=np.array([False, False, True]))
    assert plan_step_item(forced, STEP_WHOLE).group(1) == ([0, 8], [[], [20.0]])
    # a table_column_wise table's shards: group 4, its own all-to-alls (the emulated devices run it after group 1)
    twcw = plan_step_item(replace(STEP_TASK, type_group=np.array([4, -1, -1])), STEP_SPLIT)
    assert twcw.group(4) == ([8, 8], [[1.0], [1.0]]) and twcw.group(1) == ([0, 0], [[], []])
    # table 9 in two row blocks of 60 and 40 rows (given on ranks 1 then 0), table 7 replicated on both ranks
    task = ShardingTask(np.array([9, 9, 7, 7, 8]), np.array([8, 8, 16, 16, 16]),
                        np.column_stack([[40.0, 60.0, 10.0, 10.0, 5.0], [12.0, 8.0, 0.5, 0.5, 3.0],
                                         np.zeros((5, 17))]),
                        num_rows=np.array([40, 60, 10, 10, 5]), row_block=np.array([1, 0, -1, -1, -1]),
                        replica=np.array([-1, -1, 0, 1, -1]))
    plan = Placement(2, [Shard(t, 0, int(task.dims[t])) for t in range(5)], [1, 0, 0, 1, 0])
    item = plan_step_item(task, plan)
    assert item.devices == ((StepShard(9, 8, 2, 8.0, 0, 60), StepShard(7, 16, 3, 0.5, 0, 10, 0),
                             StepShard(8, 16, 0, 3.0)),
                            (StepShard(9, 8, 2, 12.0, 60, 40), StepShard(7, 16, 3, 0.5, 0, 10, 1)))
    assert item.group(2) == ([8, 8], [[8.0], [12.0]]) and item.gradient_floats() == [160, 160]
    assert [s.view(2) for s in item.devices[1]] == [ShardView(60, 40), ShardView(replica=1, world=2)]
    assert item.devices[0][2].view(2) is None
    with pytest.raises(UserError, match=re.escape("the paper's cost has no row-wise or data-parallel tables; measure "
                                                  "this plan under the step cost (--cost step)")):
        plan_device_tables(task, plan)


def test_a_spec_gives_the_same_step_item_as_a_torchrec_plan_of_it():
    """`spec_step_item` reads an export spec and TorchRec's own plan of it (`incumbent.parameter_specs`) alike: a
    replicated table on every rank (its local batch, its rows), row blocks with their rows and their share of the
    lookups, a whole table, column shards."""
    pytest.importorskip("torchrec")
    from neuroshard.hardware.engine import StepShard, spec_step_item
    from neuroshard.sharding.planner.incumbent import parameter_specs
    from neuroshard.sharding.torchrec_export import SPEC_KIND, check_spec, to_torchrec_plan

    spec = check_spec({"kind": SPEC_KIND, "world_size": 2, "tables": [
        {"name": "a", "rows": 40, "dim": 16, "sharding_type": "data_parallel",
         "shards": [{"col_offset": 0, "width": 16, "rank": r} for r in (0, 1)]},
        {"name": "b", "rows": 100, "dim": 8, "sharding_type": "row_wise",
         "shards": [{"col_offset": 0, "width": 8, "rank": r, "row_offset": 50 * r, "rows": 50} for r in (0, 1)]},
        {"name": "c", "rows": 10, "dim": 8, "shards": [{"col_offset": 0, "width": 8, "rank": 1}]},
        {"name": "d", "rows": 30, "dim": 16, "shards": [{"col_offset": 0, "width": 8, "rank": 1},
                                                       {"col_offset": 8, "width": 8, "rank": 0}]}]})
    theirs = parameter_specs(to_torchrec_plan(spec, device_type="cpu"),
                             {("", t["name"]): (t["rows"], t["dim"]) for t in spec["tables"]})[""]
    theirs = {**theirs, "tables": sorted(theirs["tables"], key=lambda t: "abcd".index(t["name"]))}
    args = (2, [5, 6, 7, 8], [2.0, 4.0, 1.0, 3.0], lambda t, lo, rows: 0.75 if lo == 0 else 0.25)
    item = spec_step_item(spec, *args)
    assert item == spec_step_item(theirs, *args)
    assert item.devices == ((StepShard(5, 16, 3, 1.0, 0, 40, 0), StepShard(6, 8, 2, 3.0, 0, 50),
                             StepShard(8, 8, 1, 3.0)),
                            (StepShard(5, 16, 3, 1.0, 0, 40, 1), StepShard(6, 8, 2, 1.0, 50, 50),
                             StepShard(7, 8, 0, 1.0), StepShard(8, 8, 1, 3.0)))
    assert item.gradient_floats() == [640, 640]


def test_same_plan_compares_specs_as_the_torchrec_step_runs_them():
    """`dmp_step.same_plan`: an export spec and TorchRec's own plan of it (`incumbent.parameter_specs`) are one plan;
    a table on another rank, another sharding type or another kernel is not."""
    pytest.importorskip("torchrec")
    from neuroshard.hardware.dmp_step import same_plan
    from neuroshard.sharding.planner.incumbent import parameter_specs
    from neuroshard.sharding.torchrec_export import SPEC_KIND, check_spec, to_torchrec_plan

    def spec_of(c_rank: int, a_type: str = "data_parallel") -> dict:
        a = {"name": "a", "rows": 40, "dim": 16, "sharding_type": a_type,
             "shards": [{"col_offset": 0, "width": 16, "rank": r} for r in (0, 1)]} if a_type == "data_parallel" else \
            {"name": "a", "rows": 40, "dim": 16, "sharding_type": a_type,
             "shards": [{"col_offset": 0, "width": 16, "rank": r, "row_offset": 20 * r, "rows": 20} for r in (0, 1)]}
        return check_spec({"kind": SPEC_KIND, "world_size": 2, "tables": [
            a, {"name": "c", "rows": 10, "dim": 8, "shards": [{"col_offset": 0, "width": 8, "rank": c_rank}]}]})

    def theirs(spec: dict, kernel: str = "fused") -> dict:
        return parameter_specs(to_torchrec_plan(spec, device_type="cpu", compute_kernel=kernel),
                               {("", t["name"]): (t["rows"], t["dim"]) for t in spec["tables"]})[""]

    spec = spec_of(1)
    assert same_plan(spec, theirs(spec), 2) and same_plan(theirs(spec), spec, 2) and same_plan(spec, spec, 2)
    assert not same_plan(spec, theirs(spec_of(0)), 2)                   # table c on rank 0, not 1
    assert not same_plan(spec, theirs(spec_of(1, "row_wise")), 2)       # table a row-wise, not replicated
    assert not same_plan(spec, theirs(spec, kernel="dense"), 2)         # table c on the dense kernel


def test_a_step_plan_runs_each_sharding_groups_collectives_as_the_step_cost_prices_them(gloo_steps):
    """`EmulatedStep._step` on two gloo ranks with the real collectives (TorchRec's KJTAllToAll, the pooled
    all-to-alls), spied on in order: after the compute, per sharding group present the input distribution of the
    ids its shards read, then each group's backward all-to-all; then the forward all-to-alls, the first after this rank's
    delay (its compute + inputs + backwards, gathered, less the earliest rank's) and the others at once. Parts:
    [compute, the forwards, the inputs + backwards], every rank's on every rank. `STEP_SPLIT` has both all-to-all
    groups, `STEP_WHOLE` the table-wise one alone; `STEP_ROWS` a table-wise, a row-wise (its all-gather backward and
    reduce-scatter forward, on the group's width) and a data-parallel group (the all-reduce of its replicas'
    gradients, rows x dim floats, and nothing else, started before the other groups' backwards and timed with
    them, as DDP runs it beside them), and `STEP_ROWS_ONLY` the last two, the reduce-scatter then
    first to wait."""
    got, compute = gloo_steps["emulated"], STEP_COMPUTE_MS
    order = ([("input", [[3.0], [20.0]]), ("input", [[1.0], [1.0]]), ("bw", [16, 8]), ("bw", [8, 8]),
              ("fw", [16, 8]), ("fw", [8, 8])],
             [("input", [[1.0, 3.0], [20.0]]), ("bw", [32, 8]), ("fw", [32, 8])],
             [("input", [[3.0], []]), ("input", [[2.0], [1.0]]),
              ("all_reduce beside", 120, [("bw", [16, 0]), ("all_gather", 8)]), ("fw", [16, 0]), ("reduce_scatter", 8)],
             [("input", [[2.0], [1.0]]), ("all_reduce beside", 120, [("all_gather", 8)]), ("reduce_scatter", 8)])
    assert [len(got[rank]) for rank in (0, 1)] == [len(order)] * 2
    for rank in (0, 1):
        for i, ((parts, calls), want) in enumerate(zip(got[rank], order)):
            timed = [n for n, c in enumerate(calls) if c[0] != "delay" and c[0] != "gather"]
            assert [calls[n] for n in timed] == want, (rank, calls)
            delays = [c for c in calls if c[0] == "delay"]  # each timed collective's delay and median, after it
            assert [n for n, c in enumerate(calls) if c[0] == "delay"] == [n + 1 for n in timed], calls
            gathers = [c[1] for c in calls if c[0] == "gather"]  # the ready times, then the parts
            assert len(gathers) == 2 and gathers[1] == parts, (rank, calls)
            assert parts == got[1 - rank][i][0]  # both ranks return every rank's parts
            assert np.isfinite(parts).all() and [p[0] for p in parts] == list(compute), parts
            assert all(fw > 0 and before > 0 for _, fw, before in parts), parts
            first_fw = want.index(next(c for c in want if c[0] in ("fw", "reduce_scatter")))
            ready = [r[0] for r in gathers[0]]
            assert [d[1] for d in delays] == \
                [0.0] * first_fw + [ready[rank] - min(ready)] + [0.0] * (len(want) - first_fw - 1), (rank, delays)
            assert ready[rank] == compute[rank] + sum(d[2] for d in delays[:first_fw])  # + inputs + backwards
            assert parts[rank][1:] == [sum(d[2] for d in delays[first_fw:]), sum(d[2] for d in delays[:first_fw])]


def test_collectives_collection_costs_and_their_bad_inputs(tmp_path, capsys):
    """The row-wise and data-parallel collectives measured on 2 gloo ranks, their costs fitted and read back, and
    bad inputs refused in one line."""
    import json

    from neuroshard.core.artifacts import RecordLog
    from neuroshard.hardware.comm_bench import COLLECTIVE_WIDTHS, COLLECTIVES, sample_collective_width
    from neuroshard.models.collective_models import CollectiveModels

    args = ("--out_dir", tmp_path, "--ndevices", "2", "--batch_size", "64", "--num_iter", "2", "--warmup_iter", "1",
            "--collectives")
    proc = run_script("collect_comm_cost_data.py", *args, "--data_size", "10")
    assert proc.returncode == 0, proc.stderr
    meta, samples = load_cost_data(tmp_path / "comm_cost_data_2_collectives.pkl", COMM_DATA_KIND)
    assert len(samples) == 10 and meta["collectives"] is True and "T_range" not in meta
    for s in samples:
        assert s["width"] == sample_collective_width(s["index"], 0)
        assert COLLECTIVE_WIDTHS[0] <= s["width"] <= COLLECTIVE_WIDTHS[1]
        assert all(s[f"{k}_ms"].shape == (2,) and np.all(s[f"{k}_ms"] > 0) for k in COLLECTIVES)
    out = tmp_path / "coll.json"
    train = ("--data_dir", tmp_path, "--ndevices", "2", "--collectives", "--collectives_out_path", out)
    proc = run_script("train_comm_cost_model.py", *train)
    assert proc.returncode == 0, proc.stderr
    coll = CollectiveModels.load(out)
    assert coll.num_devices == 2 and coll.batch_size == 64 and sorted(coll.costs) == sorted(COLLECTIVES)
    for c in coll.costs.values():  # a cost that grows with width, nothing for no width, its held-out error kept
        w = np.array([0, 1, 100, 1000])
        ms = c.predict_np(w)
        assert ms[0] == 0 and np.all(np.diff(ms[1:]) >= 0) and ms[1] > 0 and c.held_out_mape >= 0
    # flags that do not go together
    refused(capsys, "collect_comm_cost_data.py", *args, "--input_dist", untouched=[tmp_path],
            match=re.escape("error: --collectives measures the row-wise and data-parallel collectives alone; drop "
                            "--input_dist"))
    refused(capsys, "train_comm_cost_model.py", *train, "--fw_wait_term", untouched=[tmp_path],
            match=re.escape("error: --fw_wait_term is for the forward model; drop it with --collectives"))
    refused(capsys, "train_comm_cost_model.py", *train[:-1], f"{tmp_path}/new/", untouched=[tmp_path],
            match=re.escape(f"error: --collectives_out_path {tmp_path}/new/ ends in '/', which names a folder; name "
                            "a file to write"))
    refused(capsys, "train_comm_cost_model.py", *train, "--lr", "5", untouched=[tmp_path],
            match=re.escape("error: --lr has no effect with --collectives (each collective's cost is a least-squares "
                            "fit on 4 of every 5 samples); drop --lr"))
    # all-to-all samples under the collectives file's name, and damaged collectives samples, leave the costs as
    # they were
    saved = out.read_bytes()
    header = {"ndevices": 2, "device": "cpu", "batch_size": 64}
    good = {"width": 8, **{f"{k}_ms": [1.0, 2.0] for k in COLLECTIVES}}
    damaged = (f"holds damaged collectives samples (each needs a whole width from 1 and 2 plausible ms for each of "
               f"{', '.join(COLLECTIVES)}); delete it and collect again")
    for name, head, rec, want in (
            ("a2a", header, {"dim_sums": [1, 2]}, "does not hold 2-device collectives samples; collect them with "
                                                  "collect_comm_cost_data.py --collectives --ndevices 2"),
            ("neg", {**header, "collectives": True}, {**good, "all_reduce_ms": [1.0, -1.0]}, damaged),
            ("boolw", {**header, "collectives": True}, {**good, "width": True}, damaged),
            ("strms", {**header, "collectives": True}, {**good, "reduce_scatter_ms": ["1", "2"]}, damaged),
            ("boolms", {**header, "collectives": True}, {**good, "reduce_scatter_ms": [True, 2.0]}, damaged),
            ("nan", {**header, "collectives": True}, {**good, "all_gather_ms": [float("nan"), 1.0]}, damaged),
            ("zerow", {**header, "collectives": True}, {**good, "width": 0}, damaged),
            ("missing", {**header, "collectives": True}, {"width": 8}, damaged)):
        path = tmp_path / name / "comm_cost_data_2_collectives.pkl"
        with RecordLog(path, COMM_DATA_KIND, head) as log:
            for j in range(10):
                log.append({"index": j, **(rec if j == 3 else good)})
        refused(capsys, "train_comm_cost_model.py", "--data_dir", path.parent, *train[2:], untouched=[tmp_path],
                match=re.escape(f"error: {path} {want}"))
    assert out.read_bytes() == saved
    # a costs file edited or forged: one line naming it and the fix
    fix = "; make it again with collect_comm_cost_data.py --collectives"
    obj = json.loads(saved)
    for name, edit, want in (
            ("kind", lambda o: o.update(kind="x"), "not a collectives cost file"),
            ("list", lambda o: o.clear(), "not a collectives cost file"),
            ("devices", lambda o: o.update(num_devices=True), "num_devices must be a whole number from 2"),
            ("batch", lambda o: o.update(batch_size=0), "batch_size must be a whole number from 1"),
            ("missing", lambda o: o["collectives"].pop("all_reduce"), "collectives must hold exactly"),
            ("extra", lambda o: o["collectives"].update(x={}), "collectives must hold exactly"),
            ("negative", lambda o: o["collectives"]["all_gather"].update(latency_ms=-1),
             "all_gather's latency_ms must be a number from 0"),
            ("huge", lambda o: o["collectives"]["reduce_scatter"].update(ms_per_width=1e300),
             "reduce_scatter's ms_per_width must be a number from 0"),
            ("string", lambda o: o["collectives"]["all_reduce"].update(ms_per_width="0.1"),
             "all_reduce's ms_per_width must be a number from 0"),
            ("mape", lambda o: o["collectives"]["all_reduce"].update(held_out_mape=-0.5),
             "all_reduce's held_out_mape must be a number from 0 or null"),
            ("meta", lambda o: o.update(meta=[]), "meta must be an object"),
            ("metabatch", lambda o: o["meta"].update(batch_size=128), "batch_size 64 but meta.batch_size 128")):
        forged = json.loads(saved)
        edit(forged)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(forged))
        with pytest.raises(UserError, match=re.escape(f"{path}: {want}") + ".*" + re.escape(fix)):
            CollectiveModels.load(path)
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(obj).replace(str(obj["collectives"]["all_gather"]["latency_ms"]), "NaN", 1))
    with pytest.raises(UserError, match="all_gather's latency_ms must be a number from 0"):
        CollectiveModels.load(path)
