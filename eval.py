"""Step 6: shard every task with an algorithm, then measure the plans on real hardware (DESIGN.md §3.7)."""
from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from neuroshard.backends import resolve_hardware
from neuroshard.cli import ArgumentParser, run_main
from neuroshard.dataset import DLRMDataset
from neuroshard.errors import UserError
from neuroshard.evaluator import measure_plans, plan_device_tables
from neuroshard.results import print_summary, summarize, write_results
from neuroshard.sharders import (add_sharder_args, load_simulator, make_sharders, model_paths, parse_algs,
                                 shard_rows)
from neuroshard.tasks import load_tasks


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--data_dir", default="data/dlrm_datasets", help="processed dataset")
    p.add_argument("--task_path", default="data/tasks/test.pkl")
    p.add_argument("--alg", default="neuroshard", help="algorithm, comma-separated list, or all")
    p.add_argument("--gpu_devices", default=None, help="comma-separated GPU ids, one rank each (CUDA)")
    p.add_argument("--ndevices", type=int, default=4, help="ranks (CPU processes) when not on GPUs")
    p.add_argument("--max_mem", type=float, default=4.0, help="memory of one device, GB")
    p.add_argument("--batch_size", type=int, default=None, help="first B samples of the dataset batch (default all)")
    p.add_argument("--warmup_iter", type=int, default=10)
    p.add_argument("--num_iter", type=int, default=100)
    p.add_argument("--results_csv", default=None, help="default results/eval_<alg>.csv")
    p.add_argument("--device", default="auto")
    p.add_argument("--backend", default="auto")
    p.add_argument("--seed", type=int, default=0)
    add_sharder_args(p)
    args = p.parse_args(argv)
    algs = parse_algs(args.alg)
    hw = resolve_hardware(args.device, args.backend, args.gpu_devices)
    gpu_ids = [int(g) for g in args.gpu_devices.split(",")] if args.gpu_devices else None
    N = len(gpu_ids) if gpu_ids else args.ndevices
    ds = DLRMDataset.load(args.data_dir)
    batch = args.batch_size or ds.batch_size
    ds.table_bags(0, batch)  # validates --batch_size
    if N < 2 or batch % N:
        raise UserError(f"need >= 2 ranks and a batch divisible by them, got {N} ranks and batch {batch}")
    tasks = load_tasks(args.task_path, ds)
    if min(t.num_tables for t in tasks) < N:
        raise UserError(f"{N} ranks but a task in {args.task_path} has only "
                        f"{min(t.num_tables for t in tasks)} tables; use fewer --ndevices or larger tasks")
    sim = None
    if "neuroshard" in algs or all(Path(p).exists() for p in model_paths(args, N)):
        sim = load_simulator(args, N)  # also scores every plan: the simulator's fidelity
    rows, plans = [], {}
    for row, task, res in shard_rows(make_sharders(algs, args, N, sim, batch), tasks, N, args.max_mem):
        row["sim_cost_ms"] = sim.plan_cost(task, res.plan).cost_ms if sim is not None and not res.oom else float("nan")
        rows.append(row)
        if not res.oom:
            plans[(row["alg"], row["task"])] = plan_device_tables(task, res.plan)
    print(f"measuring {len(plans)} plans on {N} ranks ({hw.backend}/{hw.device}, batch {batch}, "
          f"{args.warmup_iter} warm-up + {args.num_iter} timed iterations)")
    with tqdm(total=len(plans), desc="plans") as bar:
        measured = measure_plans(ds, hw, batch, plans, N, args.warmup_iter, args.num_iter,
                                 on_result=lambda *_: bar.update(), gpu_ids=gpu_ids)
    for r in rows:
        m = measured.get((r["alg"], r["task"]))
        r["cost_ms"] = m.cost_ms if m else float("nan")
        if m:
            r.update(compute_ms=m.compute_ms, fw_ms=m.fw_ms, bw_ms=m.bw_ms)
    out = Path(args.results_csv or f"results/eval_{args.alg.replace(',', '+')}.csv")
    write_results(out, rows, **hw.describe(), batch_size=batch, ndevices=N, max_mem_gb=args.max_mem,
                  warmup_iter=args.warmup_iter, num_iter=args.num_iter, seed=args.seed,
                  task_path=str(args.task_path), dataset=str(ds.path))
    summary = summarize(rows, "cost_ms")
    print_summary(summary, f"measured cost on hardware ({len(tasks)} tasks) -> {out}")
    for s in summary:
        print(f"{s['alg']}: average cost {s['mean_cost_ms']:.3f} ms  Valid {s['valid']} / {s['total']}")
    return 0


if __name__ == "__main__":
    run_main(main)
