"""Step 4a: pre-train the compute cost model on collected compute-cost samples (DESIGN.md §3.3)."""
from __future__ import annotations

from neuroshard.core.cli import config_from_args, run_main, step_parser
from neuroshard.core.config import TrainComputeConfig
from neuroshard.models.fitting import train_compute_model


def main(argv=None) -> int:
    args = step_parser(TrainComputeConfig, __doc__).parse_args(argv)
    train_compute_model(config_from_args(TrainComputeConfig, args))
    return 0


if __name__ == "__main__":
    run_main(main, interrupted="interrupted: nothing was written (a model file there is as it was); rerun the same "
                                  "command to train again")
