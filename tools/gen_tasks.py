"""Step 2: draw sharding tasks (lists of dataset tables with dims) from a processed dataset."""
from __future__ import annotations

from neuroshard.core.cli import config_from_args, run_main, step_parser
from neuroshard.core.config import TasksConfig
from neuroshard.data.tasks import make_task_file


def main(argv=None) -> int:
    make_task_file(config_from_args(TasksConfig, step_parser(TasksConfig, __doc__).parse_args(argv)))
    return 0


if __name__ == "__main__":
    run_main(main)
