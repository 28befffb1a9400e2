"""Step 3b: measure forward/backward all-to-all costs for many dim layouts and delays (DESIGN.md §3.2), or with
--input_dist TorchRec's input distribution (its KJTAllToAll of ids and lengths, §3.4b) for many feature layouts,
or with --collectives the reduce-scatter, all-gather and all-reduce of TorchRec's row-wise and data-parallel
groups at many widths.

Spawns --ndevices ranks itself on one machine (gloo on CPU, NCCL on CUDA); under torchrun it runs
as one rank of the launched group instead (rank 0 writes the file), and --ndevices defaults to its world size.
"""
from __future__ import annotations

from neuroshard.core.cli import config_from_args, run_main, step_parser
from neuroshard.core.config import CommCollectConfig
from neuroshard.hardware.collect import collect_comm
from neuroshard.hardware.launch import default_ndevices


def main(argv=None) -> int:
    a = step_parser(CommCollectConfig, __doc__).parse_args(argv)
    default_ndevices(a)
    collect_comm(config_from_args(CommCollectConfig, a))
    return 0


if __name__ == "__main__":
    run_main(main)
