"""Search speed: NeuroShard vs TorchRec's planner on tasks of 10-60 tables (4 and 8 devices) and one
856-table task on 16 devices. Run by hand: python benchmarks/search_speed.py [--data_dir ...]

Uses trained cost models if --compute_model exists (timing does not depend on the weights, only on
the network shapes), otherwise the same architectures with random weights. One CPU thread.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from neuroshard.core.types import Cluster  # noqa: E402
from neuroshard.data.dataset import DLRMDataset  # noqa: E402
from neuroshard.data.features import dim_choices, table_size_gb  # noqa: E402
from neuroshard.data.tasks import ShardingTask  # noqa: E402
from neuroshard.models.cost_models import CommCostModel, ComputeCostModel  # noqa: E402
from neuroshard.sharding.search import NeuroShardSharder  # noqa: E402
from neuroshard.sharding.simulator import Simulator  # noqa: E402


def simulator(n: int, compute_path: Path) -> Simulator:
    compute = ComputeCostModel.load(compute_path) if compute_path.exists() else ComputeCostModel({"device": "cpu"})
    return Simulator(compute, CommCostModel(n, "fw", {"device": compute.meta.get("device")}),
                     CommCostModel(n, "bw", {"device": compute.meta.get("device")}))


def draw_task(ds: DLRMDataset, T: int, rng) -> ShardingTask:
    return ShardingTask.from_dataset(ds, rng.integers(0, ds.num_tables, T), rng.choice(dim_choices(128), T))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data_dir", default="data/dlrm_datasets")
    p.add_argument("--compute_model", default="models/compute.pt")
    p.add_argument("--tasks_per_size", type=int, default=5)
    p.add_argument("--out_csv", default="results/bench_search_speed.csv")
    p.add_argument("--skip_torchrec", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    ds = DLRMDataset.load(args.data_dir)
    rng = np.random.default_rng(0)
    algs = {"neuroshard": lambda n: NeuroShardSharder(simulator(n, Path(args.compute_model)))}
    if not args.skip_torchrec:
        from neuroshard.sharding.torchrec_baseline import TorchRecSharder

        algs["torchrec"] = lambda n: TorchRecSharder(ds.batch_size)
    cases = [(T, n) for n in (4, 8) for T in (10, 20, 30, 40, 50, 60) for _ in range(args.tasks_per_size)] + [(856, 16)]
    rows = []
    sharders = {(a, n): f(n) for a, f in algs.items() for n in (4, 8, 16)}
    for T, n in cases:
        task = draw_task(ds, T, rng)
        mem = max(table_size_gb(task.rows, task.dims).sum() / n * 1.3, task.sizes_gb().max())
        for alg in algs:
            t0 = time.perf_counter()
            plan = sharders[(alg, n)](task, Cluster(n, mem))
            rows.append({"alg": alg, "tables": T, "devices": n, "seconds": time.perf_counter() - t0,
                         "planned": plan is not None})
            print(f"{alg:<11} {T:>4} tables {n:>2} devices {rows[-1]['seconds']:8.3f} s", flush=True)
    df = pd.DataFrame(rows)
    table = df.groupby(["devices", "tables", "alg"]).seconds.median().unstack("alg")
    print("\nmedian planning time (s), one CPU thread\n" + table.to_string(float_format=lambda x: f"{x:.3f}"))
    Path(args.out_csv).parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out_csv, index=False)
    print(f"wrote {args.out_csv}")


if __name__ == "__main__":
    main()
