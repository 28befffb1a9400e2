"""Plan your own tables: a table list (CSV/JSON) or real ids in, a sharding plan out (plan.json), optionally
measured on hardware and exported as a TorchRec ShardingPlan."""
from __future__ import annotations

from neuroshard.core.cli import config_from_args, run_main, step_parser
from neuroshard.core.config import ShardTablesConfig
from neuroshard.planning.shard_tables import shard_tables


def main(argv=None) -> int:
    shard_tables(config_from_args(ShardTablesConfig, step_parser(ShardTablesConfig, __doc__).parse_args(argv)))
    return 0


if __name__ == "__main__":
    run_main(main, interrupted="interrupted: nothing was written")
