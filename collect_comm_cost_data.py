"""Step 3b: measure forward/backward all-to-all costs for many dim layouts and delays (DESIGN.md §3.2).

Spawns --ndevices ranks itself on one machine (gloo on CPU, NCCL on CUDA); under torchrun it runs
as one rank of the launched group instead (rank 0 writes the file).
"""
from __future__ import annotations

from neuroshard.core.cli import ArgumentParser, parse_gpu_devices, run_main
from neuroshard.hardware.collect import collect_comm


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--data_size", type=int, default=1000, help="samples the output file should hold")
    p.add_argument("--gpu_devices", default=None, help="comma-separated GPU ids, one rank each (CUDA)")
    p.add_argument("--ndevices", type=int, default=4, help="number of ranks (CPU processes)")
    p.add_argument("--T_range", default="10,60")
    p.add_argument("--sleep_range", default="1,20", help="straggler spread range, ms")
    p.add_argument("--max_dim", type=int, default=128)
    p.add_argument("--batch_size", type=int, default=4096, help="global batch (divisible by the number of ranks)")
    p.add_argument("--warmup_iter", type=int, default=5)
    p.add_argument("--num_iter", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--out_dir", default="data/cost_data")
    a = p.parse_args(argv)
    collect_comm(a.out_dir, a.ndevices, a.data_size, a.T_range, a.sleep_range, a.max_dim, a.batch_size,
                       a.warmup_iter, a.num_iter, a.seed, a.device, parse_gpu_devices(a.gpu_devices))
    return 0


if __name__ == "__main__":
    run_main(main)
