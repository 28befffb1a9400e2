"""Step 3a: measure the compute cost of many random shards on hardware (DESIGN.md §3.1)."""
from __future__ import annotations

import os
from pathlib import Path

from neuroshard.backends import resolve_hardware
from neuroshard.cli import ArgumentParser, run_main
from neuroshard.compute_bench import collect_compute_samples
from neuroshard.dataset import DLRMDataset
from neuroshard.errors import UserError


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--data_size", type=int, default=1000, help="samples the output file should hold")
    p.add_argument("--gpu_devices", default=None, help="comma-separated GPU ids, one worker each (CUDA)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="CPU worker processes, one thread each")
    p.add_argument("--max_tables", type=int, default=15)
    p.add_argument("--max_mem", type=float, default=4.0, help="GB per shard")
    p.add_argument("--max_dim", type=int, default=128)
    p.add_argument("--dataset_dir", default="data/dlrm_datasets")
    p.add_argument("--out_dir", default="data/cost_data")
    p.add_argument("--batch_size", type=int, default=None, help="first B samples of the dataset batch (default all)")
    p.add_argument("--warmup_iter", type=int, default=5)
    p.add_argument("--num_iter", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--backend", default="auto", help="auto, fbgemm or torch")
    args = p.parse_args(argv)
    hw = resolve_hardware(args.device, args.backend, args.gpu_devices)
    ds = DLRMDataset.load(args.dataset_dir)
    batch = args.batch_size or ds.batch_size
    ds.table_bags(0, batch)  # validates --batch_size
    if args.max_tables < 1 or args.data_size < 1 or args.num_iter < 1 or args.workers < 1:
        raise UserError("--max_tables, --data_size, --num_iter and --workers must be >= 1")
    gpu_ids = [int(g) for g in args.gpu_devices.split(",")] if args.gpu_devices else None
    out = Path(args.out_dir) / "compute_cost_data.pkl"
    print(f"hardware: {hw.describe()}  batch {batch}  -> {out}")
    rep = collect_compute_samples(out, ds, hw, args.data_size, batch, args.workers, args.warmup_iter, args.num_iter,
                                  args.seed, args.max_tables, args.max_mem, args.max_dim, gpu_ids)
    print(f"measured {rep['measured']} samples ({rep['samples_per_min']:.1f} samples/min); "
          f"{out} holds {rep['total']}")
    return 0


if __name__ == "__main__":
    run_main(main)
