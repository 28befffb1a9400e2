"""Step 5: shard every task with an algorithm and score the plans with the cost models (DESIGN.md §3.4)."""
from __future__ import annotations

from pathlib import Path

from neuroshard.cli import ArgumentParser, run_main
from neuroshard.dataset import DLRMDataset
from neuroshard.results import print_summary, summarize, write_results
from neuroshard.sharders import add_sharder_args, load_simulator, make_sharders, parse_algs, shard_rows
from neuroshard.tasks import load_tasks


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--data_dir", default="data/dlrm_datasets", help="processed dataset")
    p.add_argument("--task_path", default="data/tasks/test.pkl")
    p.add_argument("--alg", default="neuroshard", help="algorithm, comma-separated list, or all")
    p.add_argument("--ndevices", type=int, default=4)
    p.add_argument("--max_mem", type=float, default=4.0, help="memory of one device, GB")
    p.add_argument("--results_csv", default=None, help="default results/sim_<alg>.csv")
    p.add_argument("--seed", type=int, default=0)
    add_sharder_args(p)
    args = p.parse_args(argv)
    algs = parse_algs(args.alg)
    ds = DLRMDataset.load(args.data_dir)
    tasks = load_tasks(args.task_path, ds)
    sim = load_simulator(args, args.ndevices)
    rows = []
    sharders = make_sharders(algs, args, args.ndevices, sim, ds.batch_size)
    for row, task, res in shard_rows(sharders, tasks, args.ndevices, args.max_mem):
        cost = None if res.oom else sim.plan_cost(task, res.plan, args.max_mem)
        row.update(oom=cost is None, cost_ms=cost.cost_ms if cost else float("nan"),
                   compute_ms=cost.compute_ms if cost else None, fw_ms=cost.fw_ms if cost else None,
                   bw_ms=cost.bw_ms if cost else None)
        rows.append(row)
    out = Path(args.results_csv or f"results/sim_{args.alg.replace(',', '+')}.csv")
    write_results(out, rows, ndevices=args.ndevices, max_mem_gb=args.max_mem, seed=args.seed,
                  task_path=str(args.task_path), dataset=str(ds.path), compute_model=args.compute_model,
                  model_hardware={k: sim.compute.meta.get(k) for k in ("device", "backend", "batch_size")})
    summary = summarize(rows, "cost_ms")
    print_summary(summary, f"simulated cost ({len(tasks)} tasks, {args.ndevices} devices, {args.max_mem} GB) -> {out}")
    for s in summary:
        print(f"{s['alg']}: average cost {s['mean_cost_ms']:.3f} ms  Valid {s['valid']} / {s['total']}  "
              f"mean search {s['mean_search_s']:.4f} s")
    return 0


if __name__ == "__main__":
    run_main(main)
