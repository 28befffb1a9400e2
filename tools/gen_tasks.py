"""Step 2: draw sharding tasks (lists of dataset tables with dims) from a processed dataset."""
from __future__ import annotations

from neuroshard.core.cli import ArgumentParser, run_main
from neuroshard.data.tasks import make_task_file


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
    a = p.parse_args(argv)
    make_task_file(a.data_dir, a.out_dir, a.split, a.data_size, a.T_range, a.max_mem, a.max_dim, a.seed)
    return 0


if __name__ == "__main__":
    run_main(main)
