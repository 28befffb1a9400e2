"""Export a plan to TorchRec: a real `ShardingPlan` for an `EmbeddingBagCollection` of the tables.

`plan_spec` describes a plan table by table (name, rows, dim, and each column shard's offset,
width and rank); it is what `--torchrec_plan FILE` writes (JSON, so loading it runs no code).
`to_torchrec_plan(spec)` builds the TorchRec plan with TorchRec's own helpers: `table_wise(rank)`
for a table in one piece, `column_wise(ranks=...)` for a split one, and
`construct_module_sharding_plan`. A NeuroShard table may be cut into halves of different widths
(128 -> 64 + 32 + 32) while `column_wise` cuts equal blocks, so a split table is given as blocks of
its narrowest shard's width, each on the rank of the shard that holds it: the same columns on the
same ranks. The EBC's table names are the user's, each with one feature of the same name.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..core.artifacts import atomic_write_text, provenance
from ..core.errors import PlanError, UserError
from .plan import ShardingPlan

SPEC_KIND = "neuroshard.torchrec_plan"


def plan_spec(names: list[str], rows, dims, plan: ShardingPlan) -> dict:
    """Table-by-table description of `plan` (column shards sorted by offset)."""
    tables = []
    for t, name in enumerate(names):
        shards = sorted((int(s.col_start), int(s.dim), int(d)) for s, d in zip(plan.shards, plan.device_of)
                        if s.table == t)
        tables.append({"name": name, "rows": int(rows[t]), "dim": int(dims[t]),
                       "shards": [{"col_offset": c, "width": w, "rank": r} for c, w, r in shards]})
    return {"kind": SPEC_KIND, "world_size": int(plan.num_devices), "tables": tables}


def check_spec(spec: dict, where: str = "plan") -> dict:
    """Every table's columns covered exactly once by shards on ranks 0..world_size-1."""
    if not isinstance(spec, dict) or spec.get("kind") != SPEC_KIND or not isinstance(spec.get("tables"), list):
        raise UserError(f"{where} is not a neuroshard TorchRec plan; write one with tools/shard_tables.py "
                        "--torchrec_plan FILE")
    world = spec.get("world_size")
    if not isinstance(world, int) or world < 1:
        raise UserError(f"{where}: world_size must be a positive whole number")
    for t in spec["tables"]:
        try:
            cols = [0] * int(t["dim"])
            for s in t["shards"]:
                if not 0 <= int(s["rank"]) < world:
                    raise PlanError(f"table {t['name']}: rank {s['rank']} outside 0..{world - 1}")
                for c in range(int(s["col_offset"]), int(s["col_offset"]) + int(s["width"])):
                    cols[c] += 1
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise UserError(f"{where}: malformed table entry ({type(e).__name__}: {e})") from None
        except PlanError as e:
            raise UserError(f"{where}: {e}") from None
        if any(c != 1 for c in cols) or int(t["rows"]) < 1:
            raise UserError(f"{where}: table {t['name']}: columns not covered exactly once")
    return spec


def _blocks(table: dict) -> tuple[int, list[int]]:
    """Equal block width and the rank of each block, in column order."""
    width = min(s["width"] for s in table["shards"])
    ranks = []
    for s in table["shards"]:
        if s["width"] % width:
            raise PlanError(f"table {table['name']}: shard width {s['width']} is not a multiple of {width}")
        ranks += [s["rank"]] * (s["width"] // width)
    return width, ranks


def make_ebc(spec: dict, device: str = "meta"):
    """The `EmbeddingBagCollection` the plan is for (one feature per table, named like it)."""
    import torch
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    configs = [EmbeddingBagConfig(name=t["name"], embedding_dim=t["dim"], num_embeddings=t["rows"],
                                  feature_names=[t["name"]]) for t in spec["tables"]]
    return EmbeddingBagCollection(tables=configs, device=torch.device(device))


def to_torchrec_plan(spec: dict, module_path: str = "", device_type: str = "cuda", compute_kernel: str | None = None,
                     local_size: int | None = None):
    """A real TorchRec `ShardingPlan` ({module_path: EmbeddingModuleShardingPlan}) for the spec's tables.

    A table in one shard goes table-wise unless its entry says `"sharding_type": "column_wise"` (one
    column block); `compute_kernel` (e.g. "fused") is passed to TorchRec, None lets TorchRec choose;
    `local_size` is the ranks per host (device `rank % local_size`), default all ranks on one host."""
    from .torchrec_baseline import _import

    _import()  # a clear message when TorchRec is missing
    from torchrec.distributed.sharding_plan import column_wise, construct_module_sharding_plan, table_wise
    from torchrec.distributed.types import ShardingPlan as TorchRecShardingPlan

    check_spec(spec)
    per_param = {}
    for t in spec["tables"]:
        if len(t["shards"]) == 1 and t.get("sharding_type") != "column_wise":
            per_param[t["name"]] = table_wise(rank=t["shards"][0]["rank"], compute_kernel=compute_kernel)
        else:
            _, ranks = _blocks(t)
            per_param[t["name"]] = column_wise(ranks=ranks, compute_kernel=compute_kernel)
    world = spec["world_size"]
    module_plan = construct_module_sharding_plan(make_ebc(spec), per_param, local_size=local_size or world,
                                                 world_size=world, device_type=device_type)
    return TorchRecShardingPlan({module_path: module_plan})


def write_torchrec_plan(path: str | Path, spec: dict, **made_with) -> Path:
    check_spec(spec)
    return atomic_write_text(path, json.dumps({**spec, "provenance": provenance(**made_with)}, indent=1,
                                              default=str))


def load_torchrec_plan(path: str | Path, module_path: str = "", device_type: str = "cuda"):
    """Read a `--torchrec_plan` file and build the TorchRec `ShardingPlan` from it."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"TorchRec plan not found: {path}; write one with tools/shard_tables.py --torchrec_plan")
    try:
        spec = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON ({e.msg}); rewrite it with tools/shard_tables.py") from None
    return to_torchrec_plan(check_spec(spec, str(path)), module_path, device_type)
