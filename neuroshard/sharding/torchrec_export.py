"""Export a plan to TorchRec: a real `ShardingPlan` for an `EmbeddingBagCollection` of the tables.

`plan_spec` describes a plan table by table (name, rows, dim, and each column shard's offset,
width and rank); it is what `--torchrec_plan FILE` writes (`write_torchrec_plan`, JSON, so reading it runs no
code) and what `read_torchrec_plan`, the file's one reader, gives back.
`to_torchrec_plan(spec)` builds the TorchRec plan with TorchRec's own helpers: `table_wise(rank)`
for a table in one piece, `column_wise(ranks=...)` for a split one, and the per-table step of
`construct_module_sharding_plan` on each table's shape (no module is built); a `row_wise` entry
(`NeuroShardPlanner`'s tables no rank holds) is TorchRec's `row_wise()`, its row blocks checked to be TorchRec's (a
`table_row_wise` or `grid_shard` entry holds the same blocks and is TorchRec's sharding of that type on one host; a
`table_column_wise` one holds column blocks, as `column_wise`); a
`data_parallel` entry (its replicated small tables) is TorchRec's `data_parallel()`, on its dense kernel. A NeuroShard table may be
cut into halves of different widths (128 -> 64 + 32 + 32) while `column_wise` cuts equal blocks, so a split table is given as blocks of
its narrowest shard's width, each on the rank of the shard that holds it: the same columns on the
same ranks. Each table keeps the user's name as its feature name and in the spec; its TorchRec table
(module) name is `module_name`: the same name with every "." made "_" (TorchRec module names cannot
hold a dot), so `user.id` is planned as table `user_id` with feature `user.id`. Every entry of a plan
file is checked (`check_spec`) before TorchRec sees it, so a bad file gets one line naming the entry.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from ..core.artifacts import provenance, read_json, write_json
from ..core.errors import UserError
from ..core.optional_deps import require_torchrec
from ..data.table_list import MAX_DIM, MAX_NAME_CHARS, MAX_ROWS, MAX_TABLES
from .plan import Placement

SPEC_KIND = "neuroshard.torchrec_plan"
ROW_KINDS = ("row_wise", "table_row_wise", "grid_shard")  # entries of row blocks: on rank r its rows of every column
ONE_HOST_KINDS = ("table_row_wise", "table_column_wise", "grid_shard")  # exported for a topology of one host only
PINNED_KINDS = ROW_KINDS + ("data_parallel",)  # entries whose shards sit on every rank, one each (NeuroShardPlanner's)
MAX_WORLD_SIZE = 1024        # like --ndevices
MAX_CUDA_PER_HOST = 128      # torch keeps a device's index in 8 signed bits


def module_names(names: list[str]) -> list[str]:
    """Names TorchRec can take for the tables: a module name cannot hold a dot, be empty or be an attribute a
    module already has ("training", "forward", ...), so each dot becomes "_", an empty name "table", and a clash
    with another table or an attribute gets a suffix "_2", "_3", ...; every other name is kept as it is."""
    taken = set(dir(torch.nn.ModuleDict()))
    given, out, used = set(names), [], set()
    for name in names:
        base = name.replace(".", "_") or "table"
        legal, k = base, 1
        while legal in used or legal in taken or (legal != name and legal in given):
            k += 1
            legal = f"{base}_{k}"
        used.add(legal)
        out.append(legal)
    return out


def plan_spec(names: list[str], rows, dims, plan: Placement) -> dict:
    """Table-by-table description of `plan` (column shards sorted by offset)."""
    tables = []
    for t, (name, module_name) in enumerate(zip(names, module_names(names))):
        shards = sorted((int(s.col_start), int(s.dim), int(d)) for s, d in zip(plan.shards, plan.device_of)
                        if s.table == t)
        tables.append({"name": name, "module_name": module_name, "rows": int(rows[t]), "dim": int(dims[t]),
                       "shards": [{"col_offset": c, "width": w, "rank": r} for c, w, r in shards]})
    return {"kind": SPEC_KIND, "world_size": int(plan.num_devices), "tables": tables}


SPEC_KEYS = ("kind", "world_size", "tables", "provenance")
TABLE_KEYS = ("name", "module_name", "rows", "dim", "sharding_type", "shards")
SHARD_KEYS = ("col_offset", "width", "rank")
ROW_KEYS = ("row_offset", "rows")  # a row block's, besides SHARD_KEYS


def _known_keys(where: str, entry: dict, keys: tuple, what: str) -> None:
    """One line for a key a plan entry does not have (a misspelt `sharding_type` would read as table-wise)."""
    unknown = [k for k in entry if k not in keys]
    if unknown:
        raise UserError(f"{where}: unknown key {str(unknown[0])!r} ({what} holds {', '.join(keys)}); rewrite it with "
                        "tools/shard_tables.py --torchrec_plan"[:300])


def _whole(where: str, key: str, v, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise UserError(f"{where}: {key} {v!r} outside {lo}..{hi} (a whole number)"[:300])
    return v


def _shard_rows_rank(shard: dict) -> tuple[int, int]:
    """(rows, rank) of a shard of an export spec (row blocks' `rows`, else whole tables) or of a TorchRec plan's
    `planner.incumbent.parameter_specs` spec (`sizes`, `placement`)."""
    if "sizes" in shard:
        return int(shard["sizes"][0]), placement_rank(shard["placement"])
    return int(shard.get("rows", 1)), int(shard["rank"])


def empty_row_blocks(spec: dict) -> dict[str, int]:
    """Per table of a spec that leaves some rank a row block of no rows (row-wise tables of few rows: TorchRec cuts 6
    rows on 4 ranks into blocks of 2, 2, 2 and 0), how many ranks it leaves one, in the spec's order. FBGEMM's CPU
    backward fails at random where such a block is the last table of a rank's fused kernel
    (`hardware.dmp_step.empty_blocks_first`)."""
    counts = {t["name"]: sum(_shard_rows_rank(s)[0] == 0 for s in t["shards"]) for t in spec["tables"]}
    return {name: n for name, n in counts.items() if n}


def empty_kernels(spec: dict) -> dict[int, list[str]]:
    """The ranks whose shards of one sharding type are all row blocks of no rows, with those tables: TorchRec fuses
    them into one kernel of no rows, which FBGEMM's CPU operator cannot run ("weights[0] must be a GPU or MTIA
    tensor"), in whatever order."""
    held: dict[tuple, list] = {}
    for t in spec["tables"]:
        for s in t["shards"]:
            rows, rank = _shard_rows_rank(s)
            held.setdefault((t.get("sharding_type"), rank), []).append((t["name"], rows))
    out: dict[int, list[str]] = {}
    for (_, rank), tables in sorted(held.items(), key=lambda kv: kv[0][1]):
        if all(rows == 0 for _, rows in tables):
            out.setdefault(rank, []).extend(name for name, _ in tables)
    return out


def placement_rank(placement: str) -> int:
    """The rank of a TorchRec shard placement as `planner.incumbent.parameter_specs` writes it ("rank:R/cpu" or
    "rank:R/cuda:D"); ValueError for any other text."""
    placed = re.fullmatch(r"rank:(\d{1,9})/(cpu|cuda:\d{1,9})", placement) if isinstance(placement, str) else None
    if placed is None:
        raise ValueError(f"not a shard placement: {placement!r}"[:200])
    return int(placed.group(1))


def spec_of_torchrec(tables: list[dict], world: int) -> dict | None:
    """The export spec of a TorchRec planner's plan of one module (`planner.incumbent.parameter_specs` tables, with
    rows and dim) on `world` ranks: table-wise, column-wise and table-column-wise shards as column shards, row-wise and
    table-row-wise row blocks, data-parallel replicas on every rank; None where it holds a type the spec cannot
    (`grid_shard`'s blocks). Kernels are not carried: `DMPStep` runs a spec on the fused kernel (replicas on the
    dense one), so a caller that needs the same plan checks it (`hardware.dmp_step.same_plan`)."""
    out = []
    for t in tables:
        kind, dim = t["sharding_type"], int(t["dim"])
        ranks = [placement_rank(s["placement"]) for s in t["shards"]]
        if kind == "data_parallel":
            shards = [{"col_offset": 0, "width": dim, "rank": r} for r in range(world)]
        elif kind in ("row_wise", "table_row_wise"):
            shards = sorted(({"col_offset": 0, "width": dim, "rank": r, "row_offset": int(s["offsets"][0]),
                              "rows": int(s["sizes"][0])} for s, r in zip(t["shards"], ranks)),
                            key=lambda x: x["rank"])
        elif kind in ("table_wise", "column_wise", "table_column_wise"):
            shards = sorted(({"col_offset": int(s["offsets"][1]), "width": int(s["sizes"][1]), "rank": r}
                             for s, r in zip(t["shards"], ranks)), key=lambda x: x["col_offset"])
        else:
            return None
        out.append({"name": t["name"], "rows": int(t["rows"]), "dim": dim, "shards": shards, "sharding_type": kind})
    return {"kind": SPEC_KIND, "world_size": int(world), "tables": out}


def check_spec(spec: dict, where: str = "plan") -> dict:
    """Every entry well-formed and every table's columns covered exactly once by shards on ranks
    0..world_size-1, in widths TorchRec can cut (multiples of the narrowest); adds `module_name`s."""
    if not isinstance(spec, dict) or spec.get("kind") != SPEC_KIND or not isinstance(spec.get("tables"), list):
        raise UserError(f"{where} is not a neuroshard TorchRec plan; write one with tools/shard_tables.py "
                        "--torchrec_plan FILE")
    world = _whole(where, "world_size", spec.get("world_size"), 1, MAX_WORLD_SIZE)
    _known_keys(where, spec, SPEC_KEYS, "a plan")
    tables = spec["tables"]
    if not 1 <= len(tables) <= MAX_TABLES:
        raise UserError(f"{where}: a plan needs 1 to {MAX_TABLES:,} tables, got {len(tables):,}")
    seen: dict[str, int] = {}
    for i, t in enumerate(tables):
        at = f"{where} table {i}"
        if not isinstance(t, dict):
            raise UserError(f"{at}: expected an object with name, rows, dim and shards, got {type(t).__name__}")
        name = t.get("name")
        if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_CHARS or not name.isprintable():
            raise UserError(f"{at}: name must be one line of printable text of 1 to {MAX_NAME_CHARS} characters, "
                            f"got {name!r}"[:300])
        if name in seen:
            raise UserError(f"{at}: duplicate table name {name!r} (also table {seen[name]}); names must be unique")
        seen[name] = i
        at = f"{where} table {i} ({name!r})"
        _known_keys(at, t, TABLE_KEYS, "a table")
        shard_keys = SHARD_KEYS + (ROW_KEYS if t.get("sharding_type") in ROW_KINDS else ())
        for s in t.get("shards") if isinstance(t.get("shards"), list) else ():
            if isinstance(s, dict):
                _known_keys(at, s, shard_keys, f"a {t.get('sharding_type') or 'table_wise or column_wise'} shard")
        _whole(at, "rows", t.get("rows"), 1, MAX_ROWS)
        dim = _whole(at, "dim", t.get("dim"), 1, MAX_DIM)
        shards = t.get("shards")
        if t.get("sharding_type") in PINNED_KINDS:
            _check_pinned_shards(at, t, world)
            continue
        if not isinstance(shards, list) or not 1 <= len(shards) <= dim or not all(isinstance(x, dict) for x in shards):
            raise UserError(f"{at}: shards must be a list of 1 to {dim} objects with col_offset, width and rank")
        cols = [0] * dim
        for s in shards:
            _whole(at, "rank", s.get("rank"), 0, world - 1)
            c0 = _whole(at, "col_offset", s.get("col_offset"), 0, dim - 1)
            w = _whole(at, "width", s.get("width"), 1, dim - c0)
            for c in range(c0, c0 + w):
                cols[c] += 1
        if any(c != 1 for c in cols):
            first = next(j for j, c in enumerate(cols) if c != 1)
            raise UserError(f"{at}: columns not covered exactly once (column {first})")
        kind = t.get("sharding_type")  # NeuroShardPlanner's specs carry it; files written by shard_tables do not
        if kind is not None and (kind not in ("table_wise", "column_wise", "table_column_wise")
                                 or (kind == "table_wise" and len(shards) > 1)):
            raise UserError(f"{at}: sharding_type must be table_wise (one shard), column_wise, table_column_wise, "
                            f"row_wise, table_row_wise or data_parallel, got {kind!r}"[:300]
                            + "; rewrite it with tools/shard_tables.py --torchrec_plan")
        narrow = min(s["width"] for s in shards)
        uneven = [s["width"] for s in shards if s["width"] % narrow]
        if uneven:
            raise UserError(f"{at}: shard width {uneven[0]} is not a multiple of the narrowest ({narrow}); TorchRec "
                            "cuts a table into equal column blocks")
        if narrow < dim and narrow % 4:  # TorchRec widens such blocks to a multiple of 4, moving columns to other ranks
            raise UserError(f"{at}: column shards of {narrow} columns; TorchRec cuts a table's column blocks in "
                            "multiples of 4 columns")
    for t, m in zip(tables, module_names([t["name"] for t in tables])):
        t["module_name"] = m
    return spec


def _check_pinned_shards(at: str, t: dict, world: int) -> None:
    """A row-wise or data-parallel entry (`NeuroShardPlanner`'s): one shard of every column per rank, in rank order;
    row-wise, rank r holds row block r of TorchRec's own cut (`planner.row_wise.row_blocks`), given by its row_offset
    and rows, and data-parallel, every rank the whole table."""
    from .planner.row_wise import row_blocks

    shards, dim = t.get("shards"), t["dim"]
    if t["sharding_type"] in ROW_KINDS:
        keys, want = ("col_offset", "width", "rank", "row_offset", "rows"), [
            (0, dim, r, offset, rows) for r, (offset, rows) in enumerate(row_blocks(t["rows"], world))]
        need = (f"a {t['sharding_type']} table needs one shard per rank ({world}), each an object with col_offset, "
                "width, rank, row_offset and rows")

        def wrong(r: int) -> str:
            return (f"row block {r} must be rows {want[r][3]}..{want[r][3] + want[r][4]} of every column on rank {r} "
                    "(TorchRec's row-wise cut)")
    else:
        keys, want = ("col_offset", "width", "rank"), [(0, dim, r) for r in range(world)]
        need = (f"a data_parallel table needs a whole shard on every rank, in rank order (col_offset 0, width {dim}, "
                f"rank 0..{world - 1})")

        def wrong(r: int) -> str:
            return need
    if not isinstance(shards, list) or len(shards) != world or not all(isinstance(x, dict) for x in shards):
        raise UserError(f"{at}: {need}")
    for r, (s, expected) in enumerate(zip(shards, want)):
        if tuple(_whole(at, key, s.get(key), 0, MAX_ROWS) for key in keys) != expected:
            raise UserError(f"{at}: {wrong(r)}")


def _blocks(table: dict) -> tuple[int, list[int]]:
    """Equal block width and the rank of each block, in column order."""
    width = min(s["width"] for s in table["shards"])
    ranks = []
    for s in sorted(table["shards"], key=lambda s: s["col_offset"]):
        ranks += [s["rank"]] * (s["width"] // width)
    return width, ranks


def make_ebc(spec: dict, device: str = "meta"):
    """The `EmbeddingBagCollection` the plan is for (one feature per table, named like it)."""
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    configs = [EmbeddingBagConfig(name=t["module_name"], embedding_dim=t["dim"], num_embeddings=t["rows"],
                                  feature_names=[t["name"]]) for t in check_spec(spec)["tables"]]
    return EmbeddingBagCollection(tables=configs, device=torch.device(device))


def _with_kernel(generator, compute_kernel: str | None):
    """TorchRec's sharding generator with the ParameterSharding's kernel set to `compute_kernel` (TorchRec's
    `table_row_wise` takes none and picks the sharder's first); None: as it picks."""
    def generate(*args):
        sharding = generator(*args)
        if compute_kernel:
            sharding.compute_kernel = compute_kernel
        return sharding
    return generate


def _grid_blocks(t: dict, world: int) -> int:
    """How many column blocks TorchRec's grid_shard cuts the table into (its own rule, on one host of `world` ranks)."""
    from torchrec.distributed.sharding_plan import calculate_shard_sizes_and_offsets

    sizes, _ = calculate_shard_sizes_and_offsets(torch.empty((t["rows"], t["dim"]), device="meta"), world, world,
                                                 "grid_shard")
    return len(sizes) // world


def _as_type(generator, sharding_type: str):
    """TorchRec's sharding generator with the ParameterSharding's type set to `sharding_type` (TorchRec has no helper
    for table_column_wise: on one host its shards are column_wise's, `calculate_shard_sizes_and_offsets`)."""
    def generate(*args):
        sharding = generator(*args)
        sharding.sharding_type = sharding_type
        return sharding
    return generate


def to_torchrec_plan(spec: dict, module_path: str = "", device_type: str = "cuda", compute_kernel: str | None = None,
                     local_size: int | None = None):
    """A real TorchRec `ShardingPlan` ({module_path: EmbeddingModuleShardingPlan}) for the spec's tables.

    A table in one shard goes table-wise unless its entry says `"sharding_type": "column_wise"` (one
    column block) or `"table_column_wise"` (its column blocks in a sharding group of their own, one host);
    `compute_kernel` (e.g. "fused") is passed to TorchRec, None lets TorchRec choose;
    `local_size` is the ranks per host (device `rank % local_size`), default all ranks on one host."""
    require_torchrec()
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.sharding_plan import (column_wise, data_parallel, grid_shard, row_wise, table_row_wise,
                                                    table_wise)
    from torchrec.distributed.types import EmbeddingModuleShardingPlan, ShardingPlan as TorchRecShardingPlan

    check_spec(spec)
    world = spec["world_size"]
    host = world if local_size is None else local_size
    if isinstance(host, bool) or not isinstance(host, int) or not 1 <= host <= world:
        raise UserError(f"local_size {local_size!r} must be a whole number of ranks per host, 1..{world} (the plan's "
                        "world size)"[:200])
    if device_type == "cuda" and host > MAX_CUDA_PER_HOST:
        raise UserError(f"{host} ranks on one host would be CUDA devices 0..{host - 1}, past torch's device index "
                        f"{MAX_CUDA_PER_HOST - 1}; pass local_size (a Topology's local_world_size), the GPUs per host")
    per_param = {}
    for t in spec["tables"]:
        if t.get("sharding_type") in ONE_HOST_KINDS and local_size not in (None, world):
            raise UserError(f"table {t['name']!r} is planned {t['sharding_type']} over all {world} ranks, but "
                            f"local_size={local_size} makes several hosts; plan it for this topology")
        if t.get("sharding_type") == "row_wise":
            per_param[t["module_name"]] = row_wise(compute_kernel=compute_kernel)
        elif t.get("sharding_type") == "table_row_wise":  # one host: the same blocks as row_wise (check_spec)
            per_param[t["module_name"]] = _with_kernel(table_row_wise(host_index=0), compute_kernel)
        elif t.get("sharding_type") == "grid_shard":  # one host: every column block row-wise over its ranks
            per_param[t["module_name"]] = _with_kernel(grid_shard(host_indexes=[0] * _grid_blocks(t, world)),
                                                       compute_kernel)
        elif t.get("sharding_type") == "data_parallel":  # TorchRec's dense kernel
            per_param[t["module_name"]] = data_parallel()
        elif len(t["shards"]) == 1 and t.get("sharding_type") not in ("column_wise", "table_column_wise"):
            per_param[t["module_name"]] = table_wise(rank=t["shards"][0]["rank"], compute_kernel=compute_kernel)
        elif t.get("sharding_type") == "table_column_wise":  # one host: column_wise's blocks, in a group of their own
            per_param[t["module_name"]] = _as_type(column_wise(ranks=_blocks(t)[1], compute_kernel=compute_kernel),
                                                   "table_column_wise")
        else:
            _, ranks = _blocks(t)
            per_param[t["module_name"]] = column_wise(ranks=ranks, compute_kernel=compute_kernel)
    # what TorchRec's construct_module_sharding_plan does, on each table's shape alone: building the
    # EmbeddingBagCollection, even on the meta device, initialises every table
    sharder = EmbeddingBagCollectionSharder()
    module_plan = EmbeddingModuleShardingPlan()
    for t in spec["tables"]:
        shape_only = torch.empty((t["rows"], t["dim"]), device="meta")
        module_plan[t["module_name"]] = per_param[t["module_name"]](shape_only, host, world,
                                                                    device_type, sharder)
    return TorchRecShardingPlan({module_path: module_plan})


def write_torchrec_plan(path: str | Path, spec: dict, **made_with) -> Path:
    """The `--torchrec_plan` file: the spec (checked) and the provenance of what made it (`made_with`)."""
    check_spec(spec)
    return write_json(path, {**spec, "provenance": provenance(**made_with)})


def read_torchrec_plan(path: str | Path) -> dict:
    """The spec in a `--torchrec_plan` file: the inverse of `write_torchrec_plan`."""
    obj = read_json(path, "TorchRec plan", "plan", "rewrite it with tools/shard_tables.py --torchrec_plan")
    return spec_from_json(obj, str(path))


def spec_from_json(obj, where: str) -> dict:
    """The spec a plan file's JSON holds, checked (`check_spec`), without what only the file carries (provenance)."""
    spec = check_spec(obj, where)
    return {k: spec[k] for k in ("kind", "world_size", "tables")}


def load_torchrec_plan(path: str | Path, module_path: str = "", device_type: str = "cuda",
                       compute_kernel: str | None = "fused", local_size: int | None = None):
    """The TorchRec `ShardingPlan` of a `--torchrec_plan` file (`read_torchrec_plan`, then `to_torchrec_plan`).
    `compute_kernel`: every sharded table's kernel; "fused" (the optimizer's update fused into the backward), as
    `NeuroShardPlanner` hands plans out and as `shard_tables --measure` and the benchmarks measure them (replicated
    tables stay on TorchRec's dense kernel); None takes what TorchRec's sharding helpers pick for a table's shape
    alone, its dense kernel. `local_size`: the ranks per host (rank r's device `cuda:r % local_size`); default all
    ranks on one host."""
    if device_type not in ("cpu", "cuda"):
        raise UserError(f"load_torchrec_plan: device_type must be 'cpu' or 'cuda' (the ranks' devices), got "
                        f"{device_type!r}"[:200])
    if compute_kernel not in (None, "fused", "dense"):
        raise UserError(f"load_torchrec_plan: compute_kernel must be 'fused', 'dense' or None, got "
                        f"{compute_kernel!r}"[:200])
    if not isinstance(module_path, str):
        raise UserError(f"load_torchrec_plan: module_path must be a string (the module's path in your model, '' for "
                        f"the model itself), got {module_path!r}"[:200])
    return to_torchrec_plan(read_torchrec_plan(path), module_path, device_type, compute_kernel, local_size)
