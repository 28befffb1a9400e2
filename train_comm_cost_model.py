"""Step 4b: pre-train the forward and backward communication cost models (DESIGN.md §3.3), or with --input_dist
the model of TorchRec's input distribution (§3.4b), or with --collectives the costs of the row-wise and
data-parallel groups' collectives (reduce-scatter, all-gather, all-reduce: `neuroshard.models.collective_models`)."""
from __future__ import annotations

from neuroshard.core.cli import config_from_args, run_main, step_parser
from neuroshard.core.config import TrainCommConfig
from neuroshard.models.fitting import train_comm_models


def main(argv=None) -> int:
    train_comm_models(config_from_args(TrainCommConfig, step_parser(TrainCommConfig, __doc__).parse_args(argv)))
    return 0


if __name__ == "__main__":
    run_main(main, interrupted="interrupted: nothing was written (a model file there is as it was); rerun the same "
                                  "command to train again")
