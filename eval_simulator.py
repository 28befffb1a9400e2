"""Step 5: shard every task with an algorithm and score the plans with the cost models (DESIGN.md §3.4)."""
from __future__ import annotations

from neuroshard.core.cli import config_from_args, run_main, step_parser
from neuroshard.core.config import EvalSimConfig
from neuroshard.experiments.evaluate import eval_simulator


def main(argv=None) -> int:
    eval_simulator(config_from_args(EvalSimConfig, step_parser(EvalSimConfig, __doc__).parse_args(argv)))
    return 0


if __name__ == "__main__":
    run_main(main)
