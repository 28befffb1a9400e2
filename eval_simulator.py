"""Step 5: shard every task with an algorithm and score the plans with the cost models (DESIGN.md §3.4)."""
from __future__ import annotations

from neuroshard.core.cli import ArgumentParser, add_sharder_args, run_main, search_params
from neuroshard.experiments.evaluate import eval_simulator


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
    a = p.parse_args(argv)
    eval_simulator(a.data_dir, a.task_path, a.alg, a.ndevices, a.max_mem, a.results_csv, a.seed, a.compute_model,
                   a.fw_comm_model, a.bw_comm_model, search=search_params(a))
    return 0


if __name__ == "__main__":
    run_main(main)
