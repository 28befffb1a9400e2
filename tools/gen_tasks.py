"""Step 2: draw sharding tasks (lists of dataset tables with dims) from a processed dataset."""
from __future__ import annotations

from pathlib import Path

from neuroshard.cli import ArgumentParser, int_range, run_main
from neuroshard.dataset import DLRMDataset
from neuroshard.errors import UserError
from neuroshard.tasks import generate_tasks, save_tasks


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data_size", type=int, default=100, help="number of tasks")
    p.add_argument("--T_range", default="10,60", help="tables per task: lo,hi (hi exclusive)")
    p.add_argument("--max_mem", type=float, default=15.0, help="total size budget of a task, GB")
    p.add_argument("--max_dim", type=int, default=128, help="dims drawn from max_dim, max_dim/2, ... (divisible by 4)")
    p.add_argument("--data_dir", default="data/dlrm_datasets", help="processed dataset folder")
    p.add_argument("--out_dir", default="data/tasks")
    p.add_argument("--split", default="test", help="file name: OUT_DIR/SPLIT.pkl (e.g. train, test)")
    args = p.parse_args(argv)
    T_range = int_range(args.T_range, "--T_range")
    if args.data_size < 1:
        raise UserError("--data_size must be >= 1")
    if args.max_dim < 4 or args.max_dim % 4:
        raise UserError(f"--max_dim must be a positive multiple of 4, got {args.max_dim}")
    if not args.max_mem > 0:
        raise UserError("--max_mem must be > 0")
    ds = DLRMDataset.load(args.data_dir)
    tasks = generate_tasks(ds, args.data_size, T_range, args.max_mem, args.max_dim, args.seed)
    path = save_tasks(Path(args.out_dir) / f"{args.split}.pkl", tasks, ds, seed=args.seed, T_range=T_range,
                      max_mem_gb=args.max_mem, max_dim=args.max_dim)
    print(f"wrote {len(tasks)} tasks ({T_range[0]}-{T_range[1] - 1} tables, <= {args.max_mem} GB each) to {path}")
    return 0


if __name__ == "__main__":
    run_main(main)
