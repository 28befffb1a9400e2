"""Shard every task with every baseline and print a summary (no cost model needed)."""
from __future__ import annotations

import numpy as np

from neuroshard.cli import ArgumentParser, run_main
from neuroshard.dataset import DLRMDataset
from neuroshard.sharders import BASELINES, make_sharder, shard_tasks
from neuroshard.tasks import load_tasks


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--data_dir", default="data/dlrm_datasets")
    p.add_argument("--task_path", default="data/tasks/test.pkl")
    p.add_argument("--ndevices", type=int, default=4)
    p.add_argument("--max_mem", type=float, default=4.0, help="memory of one device, GB")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    ds = DLRMDataset.load(args.data_dir)
    tasks = load_tasks(args.task_path, ds)
    print(f"{len(tasks)} tasks, {args.ndevices} devices, {args.max_mem} GB each")
    print(f"{'algorithm':<20} {'valid':>8} {'lookup imbalance':>17} {'max device GB':>14} {'search ms':>10}")
    for alg in BASELINES:
        results = shard_tasks(make_sharder(alg, seed=args.seed), tasks, args.ndevices, args.max_mem)
        ok = [(t, r) for t, r in zip(tasks, results) if not r.oom]
        imb, mem = [], []
        for t, r in ok:
            load = np.zeros(args.ndevices)
            for s, d in zip(r.plan.shards, r.plan.device_of):
                load[d] += s.dim * t.pooling_factors[s.table]
            imb.append(load.max() / max(load.mean(), 1e-12))
            mem.append(r.plan.device_mem_gb(t).max())
        fmt = lambda xs: f"{np.mean(xs):.3f}" if xs else "-"
        print(f"{alg:<20} {len(ok):>4} / {len(tasks):<3} {fmt(imb):>17} {fmt(mem):>14} "
              f"{1e3 * np.mean([r.search_s for r in results]):>10.2f}")
    return 0


if __name__ == "__main__":
    run_main(main)
