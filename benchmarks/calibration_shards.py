"""Which calibration shards make the compute model right on the devices of real plans (by hand, not in CI).

python benchmarks/calibration_shards.py [--set criteo_multihot_mlperf_dcnv2] [--models_dir models]
                                        [--counts 40,120] [--ndevices 4] [--max_mem 0.04]

One cited table set of benchmarks/real_tables/, scaled as benchmarks/real_tables.py scales it. In one
measuring run (the compute collector's worker, 5 warm-up + 10 timed iterations a shard):
- `random`: max(--counts) shards from `--calibrate`'s sampler (1..2T/N tables, halved 0-2 times);
- `plan_shaped`: the devices of random plans (every table halved 0-2 times, each piece on a random device,
  every device within --max_mem), max(--counts) shards;
- the devices of every algorithm's plan (the greedy heuristics, TorchRec and NeuroShard with the
  pre-trained models): the test set.
Then, per count K and kind (and K/2 of each kind), the pre-trained compute model is fine-tuned on the
first K shards exactly as `--calibrate K` does (`fine_tune_compute`) and tested on the plans' devices:
the share of devices within ±15% and, per plan, its slowest device predicted / measured.
Writes results/calibration_shards.{md,json}; the JSON keeps every measured shard (calibration and plan devices).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from neuroshard.core.artifacts import write_results  # noqa: E402
from neuroshard.core.cli import run_main  # noqa: E402
from neuroshard.core.config import SearchParams, comm_model_paths  # noqa: E402
from neuroshard.core.errors import UserError, check_float, check_int  # noqa: E402
from neuroshard.core.types import Cluster  # noqa: E402
from neuroshard.data.features import table_size_gb  # noqa: E402
from neuroshard.data.table_list import load_table_list  # noqa: E402
from neuroshard.experiments.calibrate import (CalibrationConfig, compute_arrays, fine_tune_compute,  # noqa: E402
                                              measure_shards, sample_user_shards, user_tables_dataset)
from neuroshard.hardware.backends import resolve_hardware  # noqa: E402
from neuroshard.sharding.plan import can_split  # noqa: E402
from neuroshard.sharding.registry import make_sharder, shard_task  # noqa: E402
from neuroshard.sharding.simulator import Simulator  # noqa: E402
from real_tables import HEURISTICS, SETS, scaled_table_list  # noqa: E402

ALGS = HEURISTICS + ("torchrec", "neuroshard")


def plan_shaped_shards(task, cluster: Cluster, count: int, seed: int, max_tries: int = 100_000):
    """The devices of random plans: each table halved 0-2 times, each piece on a random device."""
    rng = np.random.default_rng([seed, 41])
    out = []
    for _ in range(max_tries):
        if len(out) >= count:
            return out[:count]
        devices = [[] for _ in range(cluster.num_devices)]
        for t in range(task.num_tables):
            dim, parts = int(task.dims[t]), 1
            for _ in range(int(rng.integers(0, 3))):
                if can_split(dim // parts):
                    parts *= 2
            for _ in range(parts):
                devices[int(rng.integers(cluster.num_devices))].append((t, dim // parts))
        shards = [(np.array([t for t, _ in d], dtype=np.int64), np.array([w for _, w in d], dtype=np.int64))
                  for d in devices]
        if all(len(t) and table_size_gb(task.rows[t], w).sum() <= cluster.max_mem_gb for t, w in shards):
            out += shards
    raise UserError(f"could not draw {count} plan-shaped shards within --max_mem {cluster.max_mem_gb:g} GB; "
                    "raise --max_mem")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", default="criteo_multihot_mlperf_dcnv2", choices=list(SETS))
    p.add_argument("--models_dir", default="models")
    p.add_argument("--counts", default="40,120")
    p.add_argument("--ndevices", type=int, default=4)
    p.add_argument("--max_mem", type=float, default=0.04)
    p.add_argument("--out_dir", default="results")
    a = p.parse_args(argv)
    try:
        counts = sorted({int(c) for c in a.counts.split(",")})
    except ValueError:
        counts = []
    if not counts or counts[0] < 15 or counts[-1] > 100_000:
        raise UserError(f"--counts must be whole numbers from 15 to 100000 (as --calibrate) separated by commas, "
                        f"got {a.counts!r}")
    check_int("--ndevices", a.ndevices, 2, 64)
    check_float("--max_mem", a.max_mem, 0, None, lo_open=True)
    sim = Simulator.load(Path(a.models_dir) / "compute.pt", *comm_model_paths(a.models_dir, a.ndevices),
                         num_devices=a.ndevices)
    batch = int(sim.compute.meta["batch_size"])
    hw = resolve_hardware("cpu", "auto")
    cluster = Cluster(a.ndevices, a.max_mem)
    with tempfile.TemporaryDirectory(prefix="neuroshard-calshards-") as tmp:
        tl = load_table_list(scaled_table_list(a.set, SETS[a.set], Path(tmp) / "tables.json"), a.max_mem)
        task = tl.task
        kinds = {"random": sample_user_shards(task, cluster, counts[-1], 0),
                 "plan_shaped": plan_shaped_shards(task, cluster, counts[-1], 0)}
        tests = []
        for alg in ALGS:
            plan = shard_task(make_sharder(alg, 0, sim, SearchParams(), batch), task, cluster).plan
            tests += [(alg, np.array([s.table for s in d], dtype=np.int64), np.array([s.dim for s in d], dtype=np.int64))
                      for d in plan.per_device()]
        every = kinds["random"] + kinds["plan_shaped"] + [(t, d) for _, t, d in tests]
        print(f"{a.set}: measuring {len(every)} shards ({counts[-1]} random, {counts[-1]} plan-shaped, "
              f"{len(tests)} plan devices), {hw.backend}/{hw.device}")
        ds = user_tables_dataset(tl, batch, 0, Path(tmp))
        y = measure_shards(ds, hw, batch, every, 5, 10)
    n = counts[-1]
    measured = {"random": y[:n], "plan_shaped": y[n:2 * n]}
    test_y = y[2 * n:]
    test_shards = [(t, d) for _, t, d in tests]
    feats = compute_arrays(task, test_shards)
    algs = np.array([alg for alg, _, _ in tests])

    def score(model) -> dict:
        pred = model.predict(*feats)
        worst = {alg: float(pred[algs == alg].max() / test_y[algs == alg].max()) for alg in ALGS}
        return {"within_15": float(np.mean(np.abs(pred / test_y - 1) <= 0.15)), "max_device_ratio": worst}

    rows = [{"shards": "none (pre-trained)", "held_out_mape": None, **score(sim.compute)}]
    for k in counts:
        for kind in ("random", "plan_shaped", "half_each"):
            if kind == "half_each":
                shards = kinds["random"][:k // 2] + kinds["plan_shaped"][:k - k // 2]
                costs = np.concatenate([measured["random"][:k // 2], measured["plan_shaped"][:k - k // 2]])
            else:
                shards, costs = kinds[kind][:k], measured[kind][:k]
            model, rep = fine_tune_compute(sim.compute, task, shards, costs, CalibrationConfig(num_shards=k))
            rows.append({"shards": f"{k} {kind}", "held_out_mape": rep["after"]["mape"], **score(model)})
    lines = [f"{a.set}, {a.ndevices} x {a.max_mem:g} GB, models from {a.models_dir}; compute only. Held-out MAPE: the "
             "third of the calibration shards `--calibrate` holds out (of their own kind).", "",
             "| calibration shards | held-out MAPE | plan devices within ±15% | slowest device, predicted / measured: "
             + ", ".join(ALGS) + " |", "|---|---:|---:|---|"]
    for r in rows:
        mape = "-" if r["held_out_mape"] is None else f"{100 * r['held_out_mape']:.0f}%"
        lines.append(f"| {r['shards']} | {mape} | {100 * r['within_15']:.0f}% | "
                     + ", ".join(f"{r['max_device_ratio'][alg]:.2f}" for alg in ALGS) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    write_results(a.out_dir, "calibration_shards", text, {
        "settings": vars(a), "hardware": hw.describe(), "rows": rows,
        "plan_devices": [{"alg": alg, "tables": t.tolist(), "dims": d.tolist(), "measured_ms": float(m)}
                         for (alg, t, d), m in zip(tests, test_y)],
        "calibration_shards": {kind: [{"tables": t.tolist(), "dims": d.tolist(), "measured_ms": float(m)}
                                      for (t, d), m in zip(kinds[kind], measured[kind])] for kind in kinds}})


if __name__ == "__main__":
    run_main(main)
