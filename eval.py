"""Step 6: shard every task with an algorithm, then measure the plans on real hardware (DESIGN.md §3.7).

Resumable: every measured plan is kept in <results_csv>.progress.pkl until the CSV is written.
"""
from __future__ import annotations

from neuroshard.core.cli import ArgumentParser, add_hardware_args, add_sharder_args, run_main, search_params
from neuroshard.experiments.evaluate import eval_hardware


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--data_dir", default="data/dlrm_datasets", help="processed dataset")
    p.add_argument("--task_path", default="data/tasks/test.pkl")
    p.add_argument("--alg", default="neuroshard", help="algorithm, comma-separated list, or all")
    p.add_argument("--ndevices", type=int, default=4, help="ranks (CPU processes) when not on GPUs")
    p.add_argument("--max_mem", type=float, default=4.0, help="memory of one device, GB")
    p.add_argument("--batch_size", type=int, default=None, help="first B samples of the dataset batch (default all)")
    p.add_argument("--warmup_iter", type=int, default=10)
    p.add_argument("--num_iter", type=int, default=100, help="timed iterations of a plan, over all rounds")
    p.add_argument("--rounds", type=int, default=5,
                   help="each task's plans are measured interleaved in this many rounds; cost = median round")
    p.add_argument("--results_csv", default=None, help="default results/eval_<alg>.csv")
    p.add_argument("--seed", type=int, default=0)
    add_hardware_args(p)
    add_sharder_args(p)
    a = p.parse_args(argv)
    eval_hardware(a.data_dir, a.task_path, a.alg, a.ndevices, a.max_mem, a.batch_size, a.warmup_iter, a.num_iter,
                  a.results_csv, a.device, a.backend, a.gpu_devices, a.seed, a.compute_model, a.fw_comm_model,
                  a.bw_comm_model, search=search_params(a), rounds=a.rounds)
    return 0


if __name__ == "__main__":
    run_main(main)
