"""NeuroShardPlanner against TorchRec's planner, every sharding type either places, in DMP steps (issue 64).

    python benchmarks/all_types_step.py [--set criteo_kaggle] [--ddr_mb 35] [--rounds 12] [--models_dir models]
                                        [--ids_order popular_first --give_ids] [--without_row_wise_by_cost]
                                        [--sharding_types data_parallel,table_wise,table_row_wise]
                                        [--swap_replicas] [--measure_first]

The cited set of benchmarks/real_tables/ (rows scaled as benchmarks/real_tables.py scales them), one
EmbeddingBagCollection with one feature per table, each table's pooling factor and `min_partition` = its dim as
constraints (TorchRec cuts no column shard narrower than 128 columns by default, so the sets' tables of 16-32
columns stay whole either way), on `--ndevices` CPU ranks of `--ddr_mb` MB of DDR each (counted as TorchRec counts
it, after its default storage reservation): small enough that the largest tables fit no rank, or as large as a
user's ranks. Both planners get the same
topology, batch, constraints and sharder (`RowWiseSharder`: row_wise offered on cpu): `NeuroShardPlanner` with
its defaults (row-wise blocks for the tables no rank holds, replicas of the small tables, the search around them,
compared with TorchRec's plan of the same sharding types), and TorchRec's `EmbeddingShardingPlanner` as the user calls it (every sharding
type the sharder offers; `--sharding_types`: those alone, for every table). Both plans are measured as TorchRec training steps (`hardware/dmp_step.py`;
`--measure_engine emulated`: as the step cost prices them on emulated independent devices, the engine the cost
models were trained on, `hardware/engine.py`) in `--rounds` interleaved rounds on gloo ranks; printed and written to `--out` (.md; the .csv row, with its
.meta.json, and the .json record with every round's step times, beside it): each
plan's sharding types, NeuroShardPlanner's comparison (each candidate's rated step, the plan handed out and why),
NeuroShard's over TorchRec's step time (paired over rounds, geometric mean, Student-t 95% interval; where
NeuroShardPlanner hands out TorchRec's own plan, `dmp_step.same_plan`, that plan is measured once and the ratio is 1)
and NeuroShard's predicted step against its measured one (`--calibration`: planned and predicted with a
calibration of the set's tables, `shard_tables --calibrate K --calibrate_dmp`). `--without_row_wise_by_cost` adds
a third plan to the same rounds: NeuroShard's with only the tables memory or constraints put row-wise.
`--swap_replicas` adds two (`swapped_replicas`): NeuroShard's plan with the tables TorchRec replicates replicated
too, and TorchRec's with those tables table-wise on NeuroShard's ranks, so each pair differs in the replicas alone.
`--measure_first` reports the plan `tools/shard_tables.py --sharding_types ... --measure` writes: NeuroShard's and
TorchRec's measured first in rounds of their own (`all_types.MEASURE_ROUNDS`), the faster kept
(`all_types.measured_faster`), then it and TorchRec's measured in the `--rounds` reported, held out (where
TorchRec's is kept, one plan measured once: the ratio is 1).

Skewed row access (`--ids_order popular_first`): the synthesised ids (each table's reuse histogram, the published
DLRM one) renumbered as a frequency-ordered vocabulary numbers them, so a row-wise table's first block takes most
of its lookups; `--give_ids` passes NeuroShardPlanner the very ids the steps read.
"""
from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))
from common import SETS as SCALES, scaled_table_list, table_list_ebc  # noqa: E402
from neuroshard.core.artifacts import check_output_dir, check_output_file, write_results  # noqa: E402
from neuroshard.core.cli import config_from_args, run_main, step_parser  # noqa: E402
from neuroshard.core.config import flag  # noqa: E402
from neuroshard.core.errors import UserError, check_float, check_int  # noqa: E402
from neuroshard.core.intervals import paired_interval  # noqa: E402


IDS_ORDERS = ("shuffled", "popular_first")


@dataclass
class AllTypesStepConfig:
    """NeuroShardPlanner against TorchRec's planner, every sharding type, in DMP steps (benchmarks/all_types_step.py)."""

    set: str = flag("criteo_kaggle", "table set of benchmarks/real_tables/")
    ndevices: int = flag(4, "gloo CPU ranks (cost models for this many in --models_dir)")
    ddr_mb: float = flag(36.0, "MB (2**20 bytes) of DDR per rank")
    rounds: int = flag(12, "interleaved rounds of both plans")
    warmup_iter: int = flag(2, "warm-up steps per plan per round")
    num_iter: int = flag(5, "timed steps per plan per round (their median)")
    models_dir: str = flag("models", "compute.pt and comm_<N>_{fw,bw}.pt")
    calibration: str = flag("", "a calibration of these tables (tools/shard_tables.py --calibrate K --calibrate_dmp "
                                "saves <plan>.calibration.pt): NeuroShardPlanner plans with it; empty: the models")
    ids_order: str = flag("shuffled", "where each table's synthesised ids sit in its rows: shuffled (hashed ids: hot "
                                      "rows spread over the rows) or popular_first (a frequency-ordered vocabulary: "
                                      "the most-read id is row 0, so TorchRec's first row block holds the hot rows)")
    give_ids: bool = flag(False, "pass NeuroShardPlanner the step's ids (ids=): its reuse histograms and its row "
                                 "blocks' shares of the lookups measured from them; TorchRec's planner takes none")
    without_row_wise_by_cost: bool = flag(False, "also plan NeuroShard with row_wise_by_cost=False (only the tables "
                                                 "memory or constraints put row-wise) and measure that plan too, "
                                                 "in the same rounds")
    swap_replicas: bool = flag(False, "also measure, in the same rounds, NeuroShard's plan with TorchRec's "
                                      "data-parallel tables replicated too and TorchRec's with those tables table-wise "
                                      "where NeuroShard put them: what the replicas alone are worth")
    sharding_types: tuple[str, ...] = flag((), "the sharding types every table's constraints allow, for both planners "
                                               "(e.g. data_parallel,table_wise,table_row_wise); empty: all",
                                           parse="str_list")
    measure_first: bool = flag(False, "first measure NeuroShard's plan and TorchRec's in all_types.MEASURE_ROUNDS "
                                      "interleaved rounds and keep the faster as NeuroShard's, as tools/shard_tables.py "
                                      "--sharding_types ... --measure writes it (`measured_faster`); the --rounds "
                                      "reported are then held out (TorchRec's kept: one plan, ratio 1)")
    measure_engine: str = flag("torchrec", "torchrec (TorchRec training steps, DistributedModelParallel) or "
                                           "emulated (the step cost's parts on emulated independent devices: the "
                                           "engine the cost models were trained on)", choices=("torchrec", "emulated"))
    out: str = flag("results/all_types_step.md", "the summary; its .json record beside it")

    def check(self) -> "AllTypesStepConfig":
        if self.set not in SCALES:
            raise UserError(f"--set: unknown table set {self.set!r}; choose from {', '.join(SCALES)}")
        if self.ids_order not in IDS_ORDERS:
            raise UserError(f"--ids_order: unknown order {self.ids_order[:40]!r}; choose from {', '.join(IDS_ORDERS)}")
        if self.sharding_types:
            from neuroshard.planning.all_types import check_sharding_types

            check_sharding_types(self.sharding_types)
        if self.measure_first and (self.swap_replicas or self.without_row_wise_by_cost):
            raise UserError("--measure_first measures the plan shard_tables --measure writes against TorchRec's alone; "
                            "leave --swap_replicas and --without_row_wise_by_cost out with it")
        check_int("--ndevices", self.ndevices, 2, 16)
        check_float("--ddr_mb", self.ddr_mb, 0.0, 1e7, lo_open=True)
        check_int("--rounds", self.rounds, 2, 1000)
        check_int("--warmup_iter", self.warmup_iter, 0, 10_000)
        check_int("--num_iter", self.num_iter, 1, 100_000)
        check_output_file(self.out, "--out")
        check_output_dir(Path(self.out).parent, "--out")
        return self


def plans(tl, a: AllTypesStepConfig, batch_per_rank: int, ids: dict | None, row_wise_by_cost: bool = True):
    """(the NeuroShardPlanner that planned the set's tables, TorchRec's plan as parameter specs); `ids`: what
    NeuroShardPlanner gets as ids= (None: none)."""
    from torchrec.distributed.planner import ParameterConstraints, Topology

    from neuroshard import NeuroShardPlanner
    from neuroshard.planning.all_types import torchrec_spec
    from neuroshard.sharding.planner.incumbent import torchrec_full_plan
    from neuroshard.sharding.planner.sharders import RowWiseSharder
    from neuroshard.sharding.planner.storage import default_reservation

    ebc = table_list_ebc(tl)
    constraints = {n: ParameterConstraints(pooling_factors=[float(p)], min_partition=int(d),
                                           sharding_types=list(a.sharding_types) or None)
                   for n, p, d in zip(tl.names, tl.task.pooling_factors, tl.task.dims)}
    topology = Topology(world_size=a.ndevices, compute_device="cpu", ddr_cap=int(a.ddr_mb * 2**20))
    sharders = [RowWiseSharder()]
    simulator = None
    if a.calibration:
        from neuroshard.planning.calibration_file import read_calibration

        simulator = read_calibration(a.calibration)
    planner = NeuroShardPlanner(topology, batch_size=batch_per_rank, constraints=constraints,
                                models_dir=a.models_dir, debug=False, simulator=simulator, ids=ids,
                                row_wise_by_cost=row_wise_by_cost)
    planner.plan(ebc, sharders)
    theirs = torchrec_full_plan(topology, batch_per_rank, constraints, default_reservation(), ebc, sharders)
    if theirs is None:
        raise UserError(f"TorchRec's planner finds no plan of {a.set} within {a.ddr_mb:g} MB a rank; raise --ddr_mb")
    return planner, torchrec_spec(theirs, tl.names, tl.rows, tl.task.dims)


def kinds_text(spec: dict) -> str:
    counts: dict = {}
    for t in spec["tables"]:
        counts[t["sharding_type"]] = counts.get(t["sharding_type"], 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))


def swapped_replicas(ours: dict, theirs: dict) -> tuple[dict, dict]:
    """(NeuroShard's export spec with the tables TorchRec's spec replicates made data_parallel, TorchRec's spec with
    those tables table_wise on the rank NeuroShard put each whole table): plans that differ from the planners' own in
    the replicas alone. A replicated table NeuroShard split is refused in one line. The specs given are not changed
    (each entry changed is a new dict; its shards are new lists)."""
    replicated = {t["name"] for t in theirs["tables"] if t["sharding_type"] == "data_parallel"}
    world = int(ours["world_size"])
    mine = {t["name"]: t for t in ours["tables"]}
    if any(mine[n]["sharding_type"] != "table_wise" for n in replicated):
        raise UserError("--swap_replicas: NeuroShard does not hold every table TorchRec replicates whole; "
                        "leave --swap_replicas out for these tables")

    def replica(t: dict) -> dict:
        return {**t, "sharding_type": "data_parallel",
                "shards": [{"col_offset": 0, "width": int(t["dim"]), "rank": r} for r in range(world)]}

    def table_wise(t: dict) -> dict:
        rank = int(mine[t["name"]]["shards"][0]["rank"])
        return {**t, "sharding_type": "table_wise", "compute_kernel": "fused", "ranks": [rank],
                "shards": [{"offsets": [0, 0], "sizes": [int(t["rows"]), int(t["dim"])], "placement": f"rank:{rank}/cpu"}]}

    return ({**ours, "tables": [replica(t) if t["name"] in replicated else t for t in ours["tables"]]},
            {**theirs, "tables": [table_wise(t) if t["name"] in replicated else t for t in theirs["tables"]]})


def measured_choice(a: AllTypesStepConfig, ds_path, batch: int, spec: dict, theirs: dict, pooling
                    ) -> tuple[dict, bool, str]:
    """--measure_first: (the plan kept, whether it is TorchRec's, the line saying why) after NeuroShard's plan and
    TorchRec's are measured in `MEASURE_ROUNDS` interleaved rounds of their own and the faster is kept, as
    `shard_tables --measure` keeps it (`all_types.measured_faster`)."""
    from neuroshard.hardware.backends import resolve_hardware
    from neuroshard.planning.all_types import MEASURE_ROUNDS, measure_specs, measured_faster, paired_record

    mine, torchrec = measure_specs(ds_path, resolve_hardware("cpu", "auto"), batch, a.warmup_iter, a.num_iter,
                                   [spec, theirs], a.ndevices, MEASURE_ROUNDS, a.measure_engine, pooling)
    faster, line = measured_faster(theirs, paired_record(mine, torchrec, False), a.ndevices, "cpu",
                                   {t["name"]: t["name"] for t in theirs["tables"]})
    return (spec, False, line) if faster is None else (faster, True, line)


def run(a: AllTypesStepConfig) -> tuple[dict, dict]:
    from neuroshard.data.table_list import load_table_list
    from neuroshard.hardware.backends import resolve_hardware
    from neuroshard.hardware.dmp_step import same_plan
    from neuroshard.planning.all_types import measure_specs
    from neuroshard.planning.user_data import user_tables_dataset
    from neuroshard.sharding.simulator import Simulator

    sim = Simulator.from_files(a.models_dir, a.ndevices, None, required=True)
    batch = int(sim.compute.meta.get("batch_size") or 4096)
    with tempfile.TemporaryDirectory() as tmp:
        path = scaled_table_list(a.set, SCALES[a.set], Path(tmp) / f"{a.set}.json")
        tl = load_table_list(path, 1e6)
        ds = user_tables_dataset(tl, batch, 0, Path(tmp), None, popular_first=a.ids_order == "popular_first")
        planner_ids = {n: ds.table_bags(t, batch)[0] for t, n in enumerate(tl.names)} if a.give_ids else None
        planner, theirs = plans(tl, a, batch // a.ndevices, planner_ids)
        ours = planner.last_result
        spec = ours.specs[""]
        same = same_plan(spec, theirs, a.ndevices)
        if (same or ours.plan is None) and (a.swap_replicas or a.without_row_wise_by_cost):
            raise UserError("NeuroShardPlanner handed out TorchRec's own plan: there is nothing to swap or take out; "
                            "leave --swap_replicas and --without_row_wise_by_cost out for these tables")
        chosen = None  # with --measure_first: the line saying which plan measured faster in the choosing rounds
        if a.measure_first and not same:
            spec, same, chosen = measured_choice(a, ds.path, batch, spec, theirs, tl.task.pooling_factors)
        specs = [spec] if same else [spec, theirs]  # one plan is measured once: the ratio is 1 by construction
        if a.without_row_wise_by_cost:
            memory_only = plans(tl, a, batch // a.ndevices, planner_ids, row_wise_by_cost=False)[0].last_result
            specs.append(memory_only.specs[""])
        if a.swap_replicas:
            specs += list(swapped_replicas(spec, theirs))
        measured = measure_specs(ds.path, resolve_hardware("cpu", "auto"), batch, a.warmup_iter, a.num_iter, specs,
                                 a.ndevices, a.rounds, a.measure_engine, tl.task.pooling_factors)
    if same:
        measured = measured[:1] * 2
    mine, torchrec = measured[:2]
    ratio = paired_interval(mine, torchrec)
    planner_sim = planner.simulator  # the same plan priced with the all-to-all models for the collectives too
    # else TorchRec's plan unchanged (none of NeuroShard's fits, or it measured faster first): not priced
    priced = ours.plan is not None and not (chosen and same)
    predicted = float(ours.cost.cost_ms) if priced else None
    a2a_priced = float(planner_sim.with_collectives(None).plan_cost(ours.task, ours.plan).cost_ms) \
        if priced and planner_sim.coll is not None else None
    # with a calibration that refitted the collectives' costs: the plan priced with the pre-trained ones instead
    pre_priced = float(planner_sim.with_collectives(sim.coll).plan_cost(ours.task, ours.plan).cost_ms) \
        if priced and a.calibration and planner_sim.coll is not None and sim.coll is not None \
        and planner_sim.coll.to_json() != sim.coll.to_json() else None
    if priced and a.measure_engine == "emulated":  # the engine measures the step cost itself, not a fit's step
        predicted = float(planner_sim.with_step_fit(None).plan_cost(ours.task, ours.plan).cost_ms)
    row = {"set": a.set, "engine": a.measure_engine, "sharding_types": ",".join(a.sharding_types) or "all",
           "ids_order": a.ids_order,
           "give_ids": a.give_ids, "ndevices": a.ndevices, "ddr_mb": a.ddr_mb, "batch": batch, "rounds": a.rounds,
           "neuroshard_types": kinds_text(spec), "torchrec_types": kinds_text(theirs),
           "neuroshard_ms": float(np.median(mine)), "torchrec_ms": float(np.median(torchrec)),
           "comparison": next((n for n in ours.notes if "plan handed out" in n), ""),
           "measure_first": chosen, "same_plan": same, "ratio": ratio.estimate, "ratio_lo": ratio.lo, "ratio_hi": ratio.hi,
           "predicted_ms": predicted,
           "predicted_over_measured": None if predicted is None else predicted / float(np.median(mine)),
           "collectives_priced": planner_sim.coll is not None,
           "a2a_priced_over_measured": None if a2a_priced is None else a2a_priced / float(np.median(mine)),
           "pretrained_collectives_over_measured": None if pre_priced is None else pre_priced / float(np.median(mine))}
    rounds = {"neuroshard": mine.tolist(), "torchrec": torchrec.tolist()}
    if a.without_row_wise_by_cost:
        other = measured[2]
        by_cost, vs_torchrec = paired_interval(mine, other), paired_interval(other, torchrec)
        row.update(memory_only_types=kinds_text(memory_only.specs[""]), memory_only_ms=float(np.median(other)),
                   by_cost_ratio=by_cost.estimate, by_cost_lo=by_cost.lo, by_cost_hi=by_cost.hi,
                   memory_only_ratio=vs_torchrec.estimate, memory_only_lo=vs_torchrec.lo,
                   memory_only_hi=vs_torchrec.hi)
        rounds["neuroshard_memory_only"] = other.tolist()
    if a.swap_replicas:
        ours_replicated, theirs_table_wise = measured[-2:]
        for key, x, base in (("ours_replicated", ours_replicated, mine), ("theirs_table_wise", theirs_table_wise, torchrec)):
            r = paired_interval(x, base)
            row.update({f"{key}_ms": float(np.median(x)), f"{key}_ratio": r.estimate, f"{key}_lo": r.lo,
                        f"{key}_hi": r.hi})
            rounds[key] = x.tolist()
    return row, rounds


def main(argv=None) -> None:
    C = AllTypesStepConfig
    a = config_from_args(C, step_parser(C, __doc__, raw_doc=True).parse_args(argv)).check()
    row, round_ms = run(a)
    steps = "DMP steps" if a.measure_engine == "torchrec" else "emulated devices (the step cost's parts)"
    text = (f"# NeuroShardPlanner against TorchRec's planner, every sharding type, {steps}\n\n"
            f"{row['set']} (ids {row['ids_order']}{'; NeuroShardPlanner given them' if a.give_ids else ''}; "
            f"sharding types allowed: {row['sharding_types']}), "
            f"{row['ndevices']} gloo CPU ranks x {row['ddr_mb']:g} MB DDR, global batch {row['batch']}, "
            f"{row['rounds']} interleaved rounds\n\n"
            f"- NeuroShard: {row['neuroshard_types']}; median step {row['neuroshard_ms']:.1f} ms\n"
            f"- TorchRec: {row['torchrec_types']}; median step {row['torchrec_ms']:.1f} ms\n"
            + (f"- chosen by measuring first: {row['measure_first'].split('--measure: ', 1)[-1]}\n" if row["measure_first"] else "")
            + ("- NeuroShard / TorchRec: 1 (TorchRec's own plan " + ("kept, as it measured faster first"
               if row["measure_first"] else "handed out by NeuroShardPlanner") + "; measured once)\n"
               if row["same_plan"] else f"- NeuroShard / TorchRec: {row['ratio']:.3f} [{row['ratio_lo']:.3f}, "
               f"{row['ratio_hi']:.3f}] (paired, 95%)\n")
            + (f"- NeuroShardPlanner's comparison: {row['comparison'].removeprefix('note: ')}\n" if row["comparison"] else "")
            + f"- NeuroShard's predicted step ({'calibrated' if a.calibration else 'uncalibrated'}) / measured: "
            + (("not priced (TorchRec's plan, kept by measuring)" if row["measure_first"] and row["same_plan"] else
                "not priced (none of NeuroShard's plans fits)") if row["predicted_over_measured"] is None else
               f"{row['predicted_over_measured']:.2f}")
            + ("" if row["a2a_priced_over_measured"] is None else
               f" (the row-wise and data-parallel collectives priced by the all-to-all models instead: "
               f"{row['a2a_priced_over_measured']:.2f})")
            + ("" if row["pretrained_collectives_over_measured"] is None else
               f"; with the pre-trained collectives' costs instead of the calibrated ones: "
               f"{row['pretrained_collectives_over_measured']:.2f}") + "\n"
            + ("" if "by_cost_ratio" not in row else
               f"- NeuroShard with row_wise_by_cost=False: {row['memory_only_types']}; median step "
               f"{row['memory_only_ms']:.1f} ms; NeuroShard / it: {row['by_cost_ratio']:.3f} [{row['by_cost_lo']:.3f}, "
               f"{row['by_cost_hi']:.3f}]; it / TorchRec: {row['memory_only_ratio']:.3f} [{row['memory_only_lo']:.3f}, "
               f"{row['memory_only_hi']:.3f}]\n")
            + ("" if "ours_replicated_ratio" not in row else
               f"- NeuroShard's plan with TorchRec's replicas: median step {row['ours_replicated_ms']:.1f} ms; / "
               f"NeuroShard's: {row['ours_replicated_ratio']:.3f} [{row['ours_replicated_lo']:.3f}, "
               f"{row['ours_replicated_hi']:.3f}]\n"
               f"- TorchRec's plan with those tables table-wise on NeuroShard's ranks: median step "
               f"{row['theirs_table_wise_ms']:.1f} ms; / TorchRec's: {row['theirs_table_wise_ratio']:.3f} "
               f"[{row['theirs_table_wise_lo']:.3f}, {row['theirs_table_wise_hi']:.3f}]\n"))
    print(text)
    write_results(Path(a.out).with_suffix(".csv"), [row], markdown=text, record={"row": row, "round_ms": round_ms},
                  **a.__dict__)


if __name__ == "__main__":
    run_main(main)
