"""A plan a user already has, as a sharding algorithm: `--alg plan:FILE`.

FILE is a `plan.json` written by tools/shard_tables.py (kind `neuroshard.plan`) or a TorchRec plan
spec written by `--torchrec_plan` (kind `neuroshard.torchrec_plan`). Both list, table by table, the
table's name, rows and dim and its column shards (offset, width, rank). The plan is applied to a task
whose tables match it one for one (same count, rows and dims, in order) on as many devices as the
plan has ranks; it is then measured and scored like any algorithm's plan, beside them, so a user
compares the plan they run today with NeuroShard's in one interleaved run. Reading a plan file runs
no code (JSON), and a file that is not a complete plan is refused with one line.
"""
from __future__ import annotations

from pathlib import Path

from ..core.errors import PlanError, UserError
from ..core.types import Cluster
from ..data.tasks import ShardingTask
from .plan import Placement, plan_from_slices
from .torchrec_export import SPEC_KIND, check_spec

PLAN_KIND = "neuroshard.plan"
PREFIX = "plan:"


def read_plan_file(path: str | Path) -> dict:
    """The plan in FILE as a TorchRec plan spec (checked: every column placed once on a real rank)."""
    from ..core.artifacts import read_json

    obj = read_json(path, "plan file", "plan file",
                    "pass a plan.json or a --torchrec_plan file (tools/shard_tables.py --out or --torchrec_plan)")
    if isinstance(obj, dict) and obj.get("kind") == PLAN_KIND:
        obj = {"kind": SPEC_KIND, "world_size": obj.get("ndevices"), "tables": obj.get("tables")}
    return check_spec(obj, str(path))


class PlanFileSharder:
    """The plan in a file, for the one task whose tables it places."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.name = f"{PREFIX}{path}"
        self.spec = read_plan_file(path)

    def __call__(self, task: ShardingTask, cluster: Cluster) -> Placement:
        tables, world = self.spec["tables"], int(self.spec["world_size"])
        if world != cluster.num_devices:
            raise UserError(f"{self.path} is a plan for {world} devices, this run has {cluster.num_devices}; "
                            f"pass --ndevices {world}")
        ours = [(int(r), int(d)) for r, d in zip(task.rows, task.dims)]
        theirs = [(int(t["rows"]), int(t["dim"])) for t in tables]
        if ours != theirs:
            first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            raise UserError(f"{self.path} places {len(theirs)} tables, the task {len(ours)}; they differ first at "
                            f"table {first} (rows, dim): plan {theirs[first] if first < len(theirs) else '-'}, task "
                            f"{ours[first] if first < len(ours) else '-'}; pass the tables the plan was made for")
        slices = {i: [(int(s["col_offset"]), int(s["width"]), int(s["rank"])) for s in t["shards"]]
                  for i, t in enumerate(tables)}
        try:
            return plan_from_slices(task.dims, world, slices)
        except PlanError as e:
            raise UserError(f"{self.path}: {e}") from None
