"""Step 6: shard every task with an algorithm, then measure the plans on real hardware (DESIGN.md §3.7).

Resumable: every measured plan is kept in <results_csv>.progress.pkl until the CSV is written.
"""
from __future__ import annotations

from neuroshard.core.cli import config_from_args, run_main, step_parser
from neuroshard.core.config import EvalConfig
from neuroshard.experiments.evaluate import eval_hardware


def main(argv=None) -> int:
    eval_hardware(config_from_args(EvalConfig, step_parser(EvalConfig, __doc__).parse_args(argv)))
    return 0


if __name__ == "__main__":
    run_main(main)
