"""Step 4c: the cost models' ensemble members, for predicted intervals and `--alg neuroshard_risk` (docs/design.md)."""
from __future__ import annotations

from neuroshard.core.cli import config_from_args, run_main, step_parser
from neuroshard.core.config import EnsembleConfig
from neuroshard.models.ensemble import train_members


def main(argv=None) -> int:
    args = step_parser(EnsembleConfig, __doc__).parse_args(argv)
    train_members(config_from_args(EnsembleConfig, args))
    return 0


if __name__ == "__main__":
    run_main(main, interrupted="interrupted: the members trained so far are kept; rerun the same command to train "
                                  "the rest")
