"""Step 3a: measure the compute cost of many random shards on hardware (DESIGN.md §3.1)."""
from __future__ import annotations

from neuroshard.core.cli import ArgumentParser, add_hardware_args, parse_gpu_devices, run_main
from neuroshard.hardware.collect import collect_compute


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--data_size", type=int, default=1000, help="samples the output file should hold")
    p.add_argument("--workers", type=int, default=None, help="CPU worker processes, one thread each (default: CPU count)")
    p.add_argument("--max_tables", type=int, default=15)
    p.add_argument("--max_mem", type=float, default=4.0, help="GB per shard")
    p.add_argument("--max_dim", type=int, default=128)
    p.add_argument("--dataset_dir", default="data/dlrm_datasets")
    p.add_argument("--out_dir", default="data/cost_data")
    p.add_argument("--batch_size", type=int, default=None, help="first B samples of the dataset batch (default all)")
    p.add_argument("--warmup_iter", type=int, default=5)
    p.add_argument("--num_iter", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    add_hardware_args(p)
    a = p.parse_args(argv)
    collect_compute(a.dataset_dir, a.out_dir, a.data_size, a.workers, a.max_tables, a.max_mem, a.max_dim,
                          a.batch_size, a.warmup_iter, a.num_iter, a.seed, a.device, a.backend,
                          parse_gpu_devices(a.gpu_devices))
    return 0


if __name__ == "__main__":
    run_main(main)
