"""A user's table list planned over TorchRec's sharding types (`tools/shard_tables.py --sharding_types`).

The tables become the module a TorchRec user would plan (`table_list_module`: one EmbeddingBagCollection on the meta
device, one feature per table) and `NeuroShardPlanner` plans it with the simulator `shard_tables` built (the
pre-trained models, or the calibration beside `--out`): each table's pooling factor and the sharding types given as
its constraints, `--ndevices` ranks of `--max_mem` GB (DDR on cpu, HBM on cuda) as TorchRec counts memory, after its
default storage reservation, and `RowWiseSharder` (which offers row_wise and table_row_wise on cpu too). So the plan
may shard tables row-wise, replicate them (data_parallel) and split them into columns; it is handed out against the
plan TorchRec's `EmbeddingShardingPlanner` makes with the same types (`NeuroShardPlanner`'s comparison).

plan.json holds the plan as the TorchRec export spec (row offsets of row-wise blocks included), the planner's
predicted step cost and its notes; `--torchrec_plan` writes the spec. With `--measure` the plan and TorchRec's are
measured on these ranks (`MEASURE_ROUNDS` interleaved rounds; where the plan handed out is TorchRec's own, it
once): as the step cost prices them on emulated independent
devices (the default engine: a row block computes the ids in its rows, a replica its rank's local batch, then each
sharding group's collectives, `hardware.engine`), or with `--measure_engine torchrec` as TorchRec training steps; and
plan.json records both and their paired ratio; the plan written is the one that measured faster: TorchRec's where
their paired ratio is above 1 (as the TW/CW path writes the measured best), where plan.json can hold it as it ran
(`measured_faster`), else the planner's. Where NeuroShard finds no plan of its own, the run is refused in one line. `--alg plan:FILE` does not take such a plan
(a task places whole tables and column shards only); `load_torchrec_plan` does. With `--ids` the planner gets each
table's ids of a batch (`planner_ids`): its reuse histogram and its row blocks' shares of the lookups are measured
from them. The reuse statistics of a table list (bin_0..bin_16) are not used: without ids, `NeuroShardPlanner` takes
the published histogram.
"""
from __future__ import annotations

import logging
import sys
from contextlib import contextmanager

from ..core.artifacts import provenance
from ..core.config import ShardTablesConfig
from ..core.costs import Cluster
from ..core.errors import UserError
from ..core.tables import format_table
from ..data.table_list import TableList
from ..sharding.plan_file import PLAN_KIND, write_plan_outputs
from ..sharding.simulator import Simulator
from ..sharding.torchrec_export import module_names, spec_of_torchrec
from .plan_report import predicted_record

MEASURE_ROUNDS = 8  # interleaved rounds of the plan handed out and TorchRec's with --measure
SHARDING_TYPES = ("data_parallel", "table_wise", "column_wise", "row_wise", "table_row_wise", "table_column_wise",
                  "grid_shard")  # TorchRec's `ShardingType` values a constraint may name


def check_sharding_types(kinds) -> list[str]:
    """--sharding_types: one or more of TorchRec's sharding types, each once."""
    kinds = list(kinds)
    bad = [k for k in kinds if k not in SHARDING_TYPES]
    if not kinds or bad or len(set(kinds)) < len(kinds):
        why = (f"unknown type {bad[0][:40]!r}" if bad else "a type named twice" if kinds else "no type")
        raise UserError(f"--sharding_types: {why}; name one or more of {', '.join(SHARDING_TYPES)}, comma-separated, "
                        "e.g. --sharding_types data_parallel,table_wise,column_wise,row_wise")
    return kinds


def row_wise_allowed(kinds) -> bool:
    """Whether --sharding_types lets a table too large for any rank go row-wise (the table list's own check of
    that is then the planner's)."""
    return kinds is not None and bool({"row_wise", "table_row_wise", "grid_shard"} & set(kinds))


def table_list_module(tl: TableList):
    """An `EmbeddingBagCollection` of a table list's tables on the meta device, one feature per table, each named
    as TorchRec can take it (`torchrec_export.module_names`: the list's name, a dot made "_"): the module a TorchRec
    user would plan."""
    import torch
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    return EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=m, embedding_dim=int(d), num_embeddings=int(r),
                                                             feature_names=[m])
                                          for m, r, d in zip(module_names(tl.names), tl.rows, tl.task.dims)],
                                  device=torch.device("meta"))


@contextmanager
def quiet_planner_logs():
    """TorchRec's planner logs a warning for a `Topology` made directly and one per data-parallel table ("Sharding
    spec not found"): lines on stderr that say nothing to a user of the command; muted while it plans."""
    loggers = [logging.getLogger(n) for n in ("torchrec.distributed.planner.types", "root")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def planner_ids(ids_path, legal: list[str], batch: int) -> dict | None:
    """With `--ids`: per table (its module name) the ids of its first `batch` samples, as `NeuroShardPlanner(ids=)`
    takes them (each table's reuse histogram and each row block's share of the lookups measured from them); None
    without."""
    if ids_path is None:
        return None
    from ..data.raw import load_raw

    indices, offsets, lengths = load_raw(ids_path, "--ids")
    B = lengths.shape[1]
    n = min(batch, B)
    ids = {m: indices[offsets[t * B]: offsets[t * B + n]] for t, m in enumerate(legal)}
    empty = [m for m, x in ids.items() if x.numel() == 0]
    if empty:  # a table no sample of the batch reads: priced by the published histogram, as without ids
        print(f"note: --ids: {len(empty)} table(s) have no lookups in the first {n} samples; their reuse histograms "
              f"are the published DLRM one ({', '.join(empty[:5])}{', ...' if len(empty) > 5 else ''})")
    return {m: x for m, x in ids.items() if x.numel() > 0} or None


def plan_all_types(cfg: ShardTablesConfig, cluster: Cluster, tl: TableList, sim: Simulator, batch: int,
                   model_paths) -> dict:
    """Plan `tl` with `NeuroShardPlanner` over `cfg.sharding_types` (module docstring), print it, write plan.json
    (and `--torchrec_plan`); returns what was planned."""
    from torchrec.distributed.planner import ParameterConstraints, Topology

    from ..sharding.planner import NeuroShardPlanner
    from ..sharding.planner.incumbent import torchrec_full_plan
    from ..hardware.dmp_step import same_plan
    from ..sharding.planner.sharders import RowWiseSharder
    from ..sharding.planner.storage import default_reservation

    kinds = check_sharding_types(cfg.sharding_types)
    device = "cuda" if cfg.hardware.device == "cuda" else "cpu"
    cap = int(cfg.max_mem * 2**30)
    topology = Topology(world_size=cluster.num_devices, compute_device=device,
                        **({"hbm_cap": cap} if device == "cuda" else {"ddr_cap": cap}))
    legal = module_names(tl.names)
    constraints = {m: ParameterConstraints(pooling_factors=[float(p)], sharding_types=list(kinds))
                   for m, p in zip(legal, tl.task.pooling_factors)}
    planner = NeuroShardPlanner(topology, batch_size=max(1, batch // cluster.num_devices), constraints=constraints,
                                simulator=sim, debug=False, cost=cfg.cost, ids=planner_ids(cfg.ids, legal, batch),
                                **({} if cfg.min_gain is None else {"min_gain": cfg.min_gain}))
    module, sharders = table_list_module(tl), [RowWiseSharder()]
    with quiet_planner_logs():
        planner.plan(module, sharders)
    res = planner.last_result
    if res.plan is None:
        for note in res.notes:
            print(note)
        raise UserError("NeuroShardPlanner found no plan of its own for these tables (it would hand out TorchRec's "
                        "EmbeddingShardingPlanner's unchanged, e.g. on UVM caching); plan them with TorchRec's planner, "
                        "or raise --max_mem or add devices")
    user_name = dict(zip(legal, tl.names))  # the spec in the list's names, its module names TorchRec's
    spec = {**res.specs[""], "tables": [{**t, "name": user_name[t["name"]], "module_name": t["name"]}
                                        for t in res.specs[""]["tables"]]}
    printed = sim.input_model_note()  # shard_tables printed it with the models
    for note in res.notes:
        if note != printed:
            print(note)
    print_spec(f"\nper table ({res.chosen}'s plan, handed out by NeuroShardPlanner; sharding types allowed: "
               f"{', '.join(kinds)})", spec)
    if res.cost is not None:
        print(f"predicted step {res.cost.cost_ms:.3f} ms at batch {batch}")
    measured, faster, alg, chosen, cost, notes = None, None, "neuroshard", res.chosen, res.cost, list(res.notes)
    if cfg.measure:
        with quiet_planner_logs():
            theirs = torchrec_full_plan(topology, planner.batch_size, constraints, default_reservation(), module,
                                        sharders)
        if theirs is None:
            print("note: TorchRec's EmbeddingShardingPlanner finds no plan of these tables with these types: nothing "
                  "to measure against")
        else:
            theirs_spec = torchrec_spec(theirs, legal, tl.rows, tl.task.dims)
            same = same_plan(spec, theirs_spec, cluster.num_devices, device)
            measured = measure_against_torchrec(cfg, tl, spec, theirs_spec, batch, same)
            faster, line = measured_faster(theirs_spec, measured, cluster.num_devices, device, user_name)
            print(line, file=sys.stderr if faster is None and measured["ratio"] > 1 else sys.stdout)
            notes.append(line)
    if faster is not None:  # TorchRec's plan, as the user's own call makes it, measured faster: it is written
        spec, alg, chosen, cost = faster, "torchrec", "torchrec", None
        print_spec("\nwritten plan: TorchRec's (measured faster); per table", spec)
    record = {"kind": PLAN_KIND, "alg": alg, "chosen": chosen, "cost": cfg.cost,
              "sharding_types": kinds, "ndevices": cluster.num_devices, "max_mem_gb": cfg.max_mem,
              "tables": [{**t, "pooling_factor": float(p)} for t, p in zip(spec["tables"], tl.task.pooling_factors)],
              "predicted": predicted_record(cost, batch), "notes": notes,
              "provenance": provenance(source=tl.source, models=[str(p) for p in model_paths], seed=cfg.seed,
                                       search=cfg.search.__dict__)}
    if measured is not None:
        record["measured"] = measured
    write_plan_outputs(cfg.out, record, cfg.torchrec_plan, spec, check_torchrec=True, alg=alg, source=tl.source)
    return {"spec": spec, "result": res, "cost": cost, "measured": measured}


def print_spec(title: str, spec: dict) -> None:
    """A spec's tables, one line each (sharding type and ranks), under `title`."""
    print(title)
    print("\n".join(format_table(["table", "rows", "dim", "sharding type", "ranks"],
                                 [[t["name"], t["rows"], t["dim"], t.get("sharding_type", "table_wise"),
                                   ",".join(str(s["rank"]) for s in t["shards"])] for t in spec["tables"]],
                                 style="text", align="lrrll")))


def measured_faster(theirs_spec: dict, measured: dict, world: int, device_type: str, user_name: dict
                    ) -> tuple[dict | None, str]:
    """(TorchRec's plan as plan.json holds it, in the list's names, where it measured faster than the plan handed
    out: their paired ratio above 1, else None; the line that says which plan is written and why). TorchRec's plan
    is written only where the spec runs it as it was measured (`same_plan`: the same types, kernels and shards);
    otherwise the plan handed out stays."""
    from ..hardware.dmp_step import same_plan

    ratio = (f"handed out / TorchRec's {measured['ratio']:.3f} [{measured['ratio_lo']:.3f}, "
             f"{measured['ratio_hi']:.3f}] in {measured['rounds']} rounds")
    if measured["same_plan"]:
        return None, "note: --measure: the plan handed out is TorchRec's own, written as it is"
    if not measured["ratio"] > 1:  # no slower, or no ratio at all (NaN)
        return None, f"note: --measure: the plan handed out is written ({ratio}: it measured no slower)"
    converted = spec_of_torchrec(theirs_spec["tables"], world)
    if converted is None or not same_plan(converted, theirs_spec, world, device_type):
        what = "grid_shard blocks" if converted is None else "kernels other than fused (dense for replicas)"
        return None, (f"warning: --measure: TorchRec's plan measured faster ({ratio}), but it holds {what}, which "
                      "plan.json cannot; the plan handed out is written (use TorchRec's EmbeddingShardingPlanner "
                      "with the same constraints for its plan)")
    spec = {**converted, "tables": [{**t, "name": user_name[t["name"]], "module_name": t["name"]}
                                    for t in converted["tables"]]}
    return spec, f"note: --measure: TorchRec's plan is written, as it measured faster ({ratio})"


def torchrec_spec(theirs, names: list[str], rows, dims) -> dict:
    """TorchRec's `ShardingPlan` of a table list's module (`table_list_module`, tables named `names`) as
    `planner.incumbent.parameter_specs` holds it (rows and dims included), its tables in the list's order."""
    from ..sharding.planner.incumbent import parameter_specs

    spec = parameter_specs(theirs, {("", n): (int(r), int(d)) for n, r, d in zip(names, rows, dims)})[""]
    return {**spec, "tables": sorted(spec["tables"], key=lambda t: names.index(t["name"]))}


def measure_specs(ds_path, hw, batch: int, warmup_iter: int, num_iter: int, specs: list[dict], ndevices: int,
                  rounds: int, engine: str = "torchrec", pooling=None) -> list:
    """Each export spec's step (ms) in each of `rounds` interleaved rounds on `ndevices` ranks over the dataset at
    `ds_path` (spec table i reads dataset table i): measured as TorchRec training steps (`DistributedModelParallel`,
    `hardware.dmp_step.DMPStep`), or with `engine="emulated"` as the step cost prices them on emulated independent
    devices (`hardware.engine.EmulatedStepCost`; `pooling`: each table's pooling factor, a row block's input taking
    its share of the table's ids in the dataset)."""
    import numpy as np

    from ..data.dataset import DLRMDataset
    from ..hardware.dmp_step import DMPStep, TorchRecItem
    from ..hardware.engine import EmulatedStepCost, EngineSettings, measure_fixed, spec_step_item

    table_ids = np.arange(len(specs[0]["tables"]))
    if engine == "torchrec":
        items, step = [TorchRecItem.of(s, table_ids) for s in specs], DMPStep
    else:
        ds, read = DLRMDataset.load(ds_path), {}

        def lookup_share(t: int, row_lo: int, rows: int) -> float:
            ids = read[t] if t in read else read.setdefault(t, ds.table_bags(t, batch)[0])  # each table read once
            return float(((ids >= row_lo) & (ids < row_lo + rows)).sum()) / max(1, ids.numel())

        items, step = [spec_step_item(s, ndevices, table_ids, pooling, lookup_share) for s in specs], EmulatedStepCost
    settings = EngineSettings(str(ds_path), hw, batch, warmup_iter, num_iter, step=step)
    got = measure_fixed(settings, items, ndevices, rounds)
    return [np.asarray(m.round_ms, np.float64) for m in got]


def measure_against_torchrec(cfg: ShardTablesConfig, tl: TableList, spec: dict, theirs_spec: dict,
                             batch: int, same: bool = False) -> dict:
    """The plan handed out (`spec`) and TorchRec's (`theirs_spec`, `torchrec_spec`) measured by `--measure_engine`
    (`measure_specs`) on these ranks in `MEASURE_ROUNDS` interleaved rounds, on the tables' ids (`--ids`, else synthesised from each
    table's rows, pooling factor and reuse histogram): each plan's median step and their paired ratio. Where they are
    one plan (`same`), it is measured once and the ratio is 1."""
    import tempfile
    from pathlib import Path

    import numpy as np

    from ..hardware.backends import resolve_hardware
    from .user_data import user_tables_dataset

    ours = {**spec, "tables": [{**t, "name": t["module_name"]} for t in spec["tables"]]}  # named as the module's
    hw = resolve_hardware(cfg.hardware.device, cfg.hardware.backend, cfg.hardware.gpu_ids)
    how = ("TorchRec training steps (DistributedModelParallel)" if cfg.measure_engine == "torchrec" else
           "the step cost prices them, on emulated independent devices (each rank's compute alone, then the "
           "collectives)")
    what = ("the plan handed out, TorchRec's own (measured once)," if same else
            "the plan handed out and TorchRec's")
    print(f"\nmeasuring {what} as {how} on {cfg.ndevices} ranks, {MEASURE_ROUNDS} "
          f"{'rounds' if same else 'interleaved rounds'}")
    with tempfile.TemporaryDirectory() as tmp:
        ds = user_tables_dataset(tl, batch, cfg.seed, Path(tmp), cfg.ids)
        got = measure_specs(ds.path, hw, batch, cfg.warmup_iter, cfg.num_iter, [ours] if same else [ours, theirs_spec],
                            cfg.ndevices, MEASURE_ROUNDS, cfg.measure_engine, tl.task.pooling_factors)
    mine, torchrec = (got[0], got[0]) if same else got
    record = paired_record(mine, torchrec, same)
    print(f"measured step: {np.median(mine):.2f} ms (one plan)" if same else
          f"measured step: the plan handed out {np.median(mine):.2f} ms, TorchRec's {np.median(torchrec):.2f} ms; "
          f"handed out / TorchRec's {record['ratio']:.3f} [{record['ratio_lo']:.3f}, {record['ratio_hi']:.3f}] "
          "(paired, 95%)")
    return {"engine": cfg.measure_engine, "neuroshard_ms": mine.tolist(), "torchrec_ms": torchrec.tolist(),
            "torchrec_types": sorted({t["sharding_type"] for t in theirs_spec["tables"]}), **record}


def paired_record(mine, torchrec, same: bool) -> dict:
    """What `measured_faster` reads of the handed-out plan's and TorchRec's steps, measured in the same rounds: the
    paired ratio (handed out / TorchRec's) and its 95% interval, the rounds, and whether they are one plan."""
    from ..core.intervals import paired_interval

    r = paired_interval(mine, torchrec)
    return {"rounds": len(mine), "ratio": r.estimate, "ratio_lo": r.lo, "ratio_hi": r.hi, "same_plan": same}
