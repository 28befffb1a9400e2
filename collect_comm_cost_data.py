"""Step 3b: measure forward/backward all-to-all costs for many dim layouts and delays (DESIGN.md §3.2).

Spawns --ndevices ranks itself on one machine (gloo on CPU, NCCL on CUDA); under torchrun it runs
as one rank of the launched group instead (rank 0 writes the file).
"""
from __future__ import annotations

from pathlib import Path

from neuroshard.backends import resolve_device
from neuroshard.cli import ArgumentParser, float_range, int_range, run_main
from neuroshard.comm_bench import collect_comm_samples
from neuroshard.errors import UserError
from neuroshard.launch import in_torchrun


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
    args = p.parse_args(argv)
    device = resolve_device(args.device, args.gpu_devices)
    gpu_ids = [int(g) for g in args.gpu_devices.split(",")] if args.gpu_devices else None
    N = len(gpu_ids) if gpu_ids else args.ndevices
    if in_torchrun():
        import os
        N = int(os.environ["WORLD_SIZE"])
    if N < 2:
        raise UserError("--ndevices must be >= 2 (an all-to-all needs peers)")
    if args.batch_size % N:
        raise UserError(f"--batch_size {args.batch_size} is not divisible by {N} ranks")
    T_range = int_range(args.T_range, "--T_range")
    sleep_range = float_range(args.sleep_range, "--sleep_range")
    out = Path(args.out_dir) / f"comm_cost_data_{N}.pkl"
    print(f"{N} ranks on {device}, batch {args.batch_size} -> {out}")
    rep = collect_comm_samples(out, N, args.data_size, args.batch_size, device, args.seed, T_range, args.max_dim,
                               sleep_range, args.warmup_iter, args.num_iter, gpu_ids)
    print(f"measured {rep['measured']} samples ({rep['samples_per_min']:.1f} samples/min); {out} holds {rep['total']}")
    return 0


if __name__ == "__main__":
    run_main(main)
