"""Step 3a: measure the compute cost of many random shards on hardware (DESIGN.md §3.1)."""
from __future__ import annotations

from neuroshard.core.cli import config_from_args, run_main, step_parser
from neuroshard.core.config import ComputeCollectConfig
from neuroshard.hardware.collect import collect_compute


def main(argv=None) -> int:
    args = step_parser(ComputeCollectConfig, __doc__).parse_args(argv)
    collect_compute(config_from_args(ComputeCollectConfig, args))
    return 0


if __name__ == "__main__":
    run_main(main)
