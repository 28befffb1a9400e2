"""A plan a user already has, as a sharding algorithm: `--alg plan:FILE`.

FILE is a `plan.json` written by tools/shard_tables.py (kind `neuroshard.plan`, `plan_record` here) or a
TorchRec plan spec written by `--torchrec_plan` (kind `neuroshard.torchrec_plan`, `torchrec_export`). Both
list, table by table, the table's name, rows and dim and its column shards (offset, width, rank), and both
are checked by the spec's one check (`check_spec`). The plan is applied to a task whose tables match it one
for one (same count, rows and dims, in order) on as many devices as the plan has ranks; it is then measured
and scored like any algorithm's plan, beside them, so a user compares the plan they run today with
NeuroShard's in one interleaved run. Reading a plan file runs no code (JSON), and a file that is not a
complete plan is refused with one line, and so is one with row-wise or data-parallel tables (`NeuroShardPlanner`'s
export): a task places whole tables and column shards, and those tables would be misread as whole.
"""
from __future__ import annotations

from pathlib import Path

from ..core.artifacts import deferred_interrupts, read_json, write_json
from ..core.errors import PlanError, UserError
from ..core.costs import Cluster
from ..data.tasks import ShardingTask
from .plan import Placement, plan_from_slices
from .torchrec_export import (MAX_WORLD_SIZE, PINNED_KINDS, SPEC_KIND,  # pinned: kinds a task cannot place
                              spec_from_json, to_torchrec_plan, write_torchrec_plan)

PLAN_KIND = "neuroshard.plan"
PREFIX = "plan:"


def plan_record(spec: dict, pooling_factors, **fields) -> dict:
    """plan.json's content: its kind, then `fields` in their order (alg, chosen, cost, max_mem_gb, predicted, ...),
    with `ndevices` and `tables` taken from the spec (a table: its spec entry and its pooling factor; a key of
    `fields` of these names only fixes where they stand). `read_plan_file` reads the spec back."""
    tables = [{**t, "pooling_factor": float(pf)} for t, pf in zip(spec["tables"], pooling_factors)]
    return {"kind": PLAN_KIND, **fields, "ndevices": spec["world_size"], "tables": tables}


def write_plan_outputs(out: str | Path, record: dict, torchrec_plan: str | Path | None, spec: dict,
                       check_torchrec: bool = False, **made_with) -> None:
    """plan.json (`record`) and, where asked, the TorchRec plan file of `spec` (`made_with`: its provenance), once
    TorchRec accepts the spec (its devices as a plan file leaves them: `load_torchrec_plan` places them), checked
    where a TorchRec file is asked for or `check_torchrec` (a plan.json of row blocks and replicas). Both are
    written as one step: a Ctrl-C or SIGTERM meanwhile waits until both are whole and then says they are, so a
    plan.json never stands beside a TorchRec file of another run, or without its own."""
    if torchrec_plan or check_torchrec:
        to_torchrec_plan(spec, device_type="cpu")  # before either file is written
    written = [str(out)] + ([str(torchrec_plan)] if torchrec_plan else [])
    try:
        with deferred_interrupts():
            write_json(out, record)
            if torchrec_plan:
                write_torchrec_plan(torchrec_plan, spec, **made_with)
    except KeyboardInterrupt as e:  # delivered once both are written
        e.args = (f"interrupted: {' and '.join(written)} written in full first",)
        raise
    print(f"\nplan written to {out}")
    if torchrec_plan:
        print(f"TorchRec plan written to {torchrec_plan} (load it with "
              "neuroshard.sharding.torchrec_export.load_torchrec_plan)")


def read_plan_file(path: str | Path) -> dict:
    """The plan in FILE (a plan.json, or a --torchrec_plan file) as a TorchRec plan spec, checked: every column
    placed once on a real rank."""
    obj = read_json(path, "plan file", "plan file",
                    "pass a plan.json or a --torchrec_plan file (tools/shard_tables.py --out or --torchrec_plan)")
    is_record = isinstance(obj, dict) and obj.get("kind") == PLAN_KIND
    if is_record:
        devices = obj.get("ndevices")
        if isinstance(devices, bool) or not isinstance(devices, int) or not 1 <= devices <= MAX_WORLD_SIZE:
            raise UserError(f"{path}: ndevices {devices!r} outside 1..{MAX_WORLD_SIZE} (a whole number: the devices "
                            "the plan is for); rewrite it with tools/shard_tables.py --out"[:300])
    return spec_from_json(_record_spec(obj) if is_record else obj, str(path))


def _record_spec(record: dict) -> dict:
    """The spec in plan.json's content (`plan_record`'s inverse), unchecked."""
    tables = record.get("tables")
    if isinstance(tables, list):  # a table's pooling factor is plan.json's, not the spec's
        tables = [{k: v for k, v in t.items() if k != "pooling_factor"} if isinstance(t, dict) else t for t in tables]
    return {"kind": SPEC_KIND, "world_size": record.get("ndevices"), "tables": tables}


class PlanFileSharder:
    """The plan in a file, for the one task whose tables it places."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.name = f"{PREFIX}{path}"
        self.spec = read_plan_file(path)
        pinned = [t for t in self.spec["tables"] if t.get("sharding_type") in PINNED_KINDS]
        if pinned:  # read as column slices they would be whole tables on their last rank: refused, not misread
            raise UserError(f"{path}: table {pinned[0]['name']!r} is {pinned[0]['sharding_type']} "
                            f"({len(pinned)} such table(s), as NeuroShardPlanner plans them); --alg plan: places "
                            "whole tables and column shards only; run this plan in TorchRec's own step "
                            "(neuroshard.sharding.torchrec_export.load_torchrec_plan, then DistributedModelParallel)")
        grouped = [t for t in self.spec["tables"] if t.get("sharding_type") == "table_column_wise"]
        if grouped:  # read as column slices they would be priced and measured in the column-wise group: refused
            raise UserError(f"{path}: table {grouped[0]['name']!r} is table_column_wise ({len(grouped)} such "
                            "table(s)); --alg plan: prices and measures column shards as column_wise, whose "
                            "collectives are not table_column_wise's; run this plan in TorchRec's own step "
                            "(neuroshard.sharding.torchrec_export.load_torchrec_plan, then DistributedModelParallel) "
                            "or plan these tables with --sharding_types")

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
