"""Step 1: raw DLRM dataset (real file or synthetic) -> processed dataset folder."""
from __future__ import annotations

from neuroshard.core.cli import config_from_args, run_main, step_parser
from neuroshard.core.config import DatasetConfig
from neuroshard.data.dataset import build_dataset


def main(argv=None) -> int:
    build_dataset(config_from_args(DatasetConfig, step_parser(DatasetConfig, __doc__).parse_args(argv)))
    return 0


if __name__ == "__main__":
    run_main(main)
