"""Plan a user's own tables (tools/shard_tables.py): table list in, plan out, handed to TorchRec.

`shard_tables` runs the user's planning path as named steps:
1. `load_inputs`: the tables (`--tables` CSV/JSON or `--ids` raw DLRM ids) and the pre-trained cost models;
2. `build_simulator`: the models to plan with: a calibration beside `--out` made for these tables and this
   hardware, a new one with `--calibrate K` (`calibrated_models.py`), or the pre-trained models;
3. `choose`: shards the tables with `--alg` (NeuroShard by default); NeuroShard's plan is handed out unless
   the simulator rates TorchRec's or a heuristic's plan of the same tables faster, or NeuroShard's less than
   `--min_gain` cheaper than TorchRec's;
4. `measure_best` (`--measure`): NeuroShard's top distinct plans, the heuristics' and TorchRec's measured in
   interleaved rounds (`measure.py`); the measured best is the plan written;
5. `write_outputs`: `--out plan.json` (the plan, its predicted and measured costs, what made it) and with
   `--torchrec_plan FILE` the plan as a TorchRec `ShardingPlan` spec (`torchrec_export`).
The plan is printed per device and per table (`plan_report.py`) when chosen and again if measuring replaces it.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from ..core.artifacts import OutputLock, check_outputs, provenance, read_json
from ..core.config import MIN_GAIN, ShardTablesConfig
from ..core.errors import UserError
from ..core.tables import format_table
from ..core.costs import Cluster, Cost, ImplausibleCost, implausible_ms
from ..data.table_list import TableList, load_table_list, tables_from_ids
from ..hardware.backends import resolve_hardware
from ..hardware.launch import rank_gpus
from ..sharding.candidates import against_baselines, handout_verdict
from ..sharding.plan import Placement
from ..sharding.plan_file import PLAN_KIND, PREFIX as PLAN_PREFIX, write_plan_outputs
from ..sharding.registry import expand_algs, make_sharder, shard_task
from ..sharding.search import plan_key
from ..sharding.simulator import Simulator
from ..sharding.torchrec_export import SPEC_KIND, plan_spec
from .all_types import check_sharding_types, plan_all_types, row_wise_allowed
from .calibrated_models import calibrated_simulator, models_words
from .calibration_file import CALIBRATION_SUFFIX, calibration_path
from .measure import MeasureConfig, candidate_plans, measure_candidates
from .plan_report import predicted_record, print_plan
from .user_data import check_measure_budget

CALIBRATION_LABEL = "the calibration file beside --out"


@dataclass(frozen=True)
class PlanInputs:
    """What the user's planning path starts from: the tables and the pre-trained cost models."""

    tables: TableList
    sim: Simulator | None    # the pre-trained cost models (None: planning without them)
    model_paths: tuple       # the model files a calibration depends on (the input-distribution model too if used)
    batch: int               # the batch the cost models predict (and --measure / --calibrate measure) at


@dataclass(frozen=True)
class Chosen:
    """A plan and what it goes by: `names` as plan.json's "chosen" says it, `cost` its predicted cost."""

    plan: Placement
    names: str
    cost: Cost | None


def shard_tables(cfg: ShardTablesConfig) -> dict:
    """Plan the user's tables with `cfg.alg`, print the plan, write it (and optionally measure it)."""
    cfg.check()
    cluster = Cluster(cfg.ndevices, cfg.max_mem)
    if cfg.sharding_types is not None:
        check_sharding_types(cfg.sharding_types)
    if cfg.alg == "all" or expand_algs([cfg.alg]) != [cfg.alg]:
        raise UserError(f"--alg takes one algorithm here, got {cfg.alg!r}")
    if cfg.measure:
        cluster.need_peers()
    with OutputLock(check_run_outputs(cfg)):
        inputs = load_inputs(cfg)
        sim, calibration, hw = build_simulator(cfg, cluster, inputs)
        models = models_words(cfg, calibration)
        try:
            return plan_and_write(cfg, cluster, inputs, sim, calibration, hw, models[1])
        except ImplausibleCost as e:  # anywhere a predicted cost would be printed, compared or written
            raise UserError(e.line(*models)) from None


def check_run_outputs(cfg: ShardTablesConfig) -> list[tuple[str, Path]]:
    """Before any work: the files this run writes (--out, --torchrec_plan, with --calibrate the calibration file
    beside --out) can be written, name no file twice and replace no input, and the plan files replace nothing but
    plan files of their kind (`check_replaces_only`). Returns them for the lock."""
    cal = calibration_path(cfg.out)
    inputs = {"--tables": cfg.tables, "--ids": cfg.ids, "--compute_model": cfg.models.compute_model,
              "--fw_comm_model": cfg.models.fw_comm_model, "--bw_comm_model": cfg.models.bw_comm_model,
              # the input-distribution model it would load: named, or the default beside the backward model
              "--input_comm_model": cfg.models.input_path(cfg.ndevices, cfg.mp_keep)[0]}
    if cfg.alg.startswith(PLAN_PREFIX):
        inputs["--alg"] = cfg.alg[len(PLAN_PREFIX):]
    outs = check_outputs({"--out": cfg.out, "--torchrec_plan": cfg.torchrec_plan,
                          CALIBRATION_LABEL: cal if cfg.calibrate is not None else None}, inputs,
                         {CALIBRATION_LABEL: "move it away or choose another --out"})
    for label, path, kind in (("--out", cfg.out, PLAN_KIND), ("--torchrec_plan", cfg.torchrec_plan, SPEC_KIND)):
        if path is not None:
            check_replaces_only(label, Path(path), kind)
    return outs



def check_replaces_only(label: str, path: Path, kind: str) -> None:
    """A plan file written at `path` replaces nothing but a file of its own `kind`: not a calibration (a name
    `<plan>.calibration.pt` is refused, whether or not it exists yet) nor any other file already there."""
    if path.name.endswith(CALIBRATION_SUFFIX):
        plan = path.with_name(path.name[:-len(CALIBRATION_SUFFIX)] + ".json")
        raise UserError(f"{label} {path} is the name of the calibration file of the plan {plan} (--calibrate saves "
                        f"it there); name the file otherwise, e.g. {label} {plan}")
    if not path.is_file():
        return
    try:
        found = read_json(path, label, "plan file").get("kind")
    except (UserError, AttributeError):  # not JSON, or not an object
        found = None
    if found != kind:
        raise UserError(f"{label} {path} exists and is not a {kind} file, which writing would replace: move it away "
                        f"or choose another {label}")



def load_inputs(cfg: ShardTablesConfig) -> PlanInputs:
    """Step 1: the tables and the pre-trained cost models; refuses, before any work, tables --measure or
    --calibrate cannot build on this machine."""
    # a table no device holds whole may still go row-wise with --sharding_types: the planner checks memory then
    fit_mem = None if row_wise_allowed(cfg.sharding_types) else cfg.max_mem
    tl = load_table_list(cfg.tables, fit_mem) if cfg.tables is not None else \
        tables_from_ids(cfg.ids, list(cfg.dims), fit_mem)
    sim = Simulator.from_files(cfg.models, cfg.ndevices, cfg.mp_keep,
                               required=cfg.alg == "neuroshard" or cfg.calibrate is not None)
    # the model files a calibration depends on: the input-distribution model too where one is used
    paths = (*cfg.models.paths(cfg.ndevices, cfg.mp_keep),
             *([cfg.models.input_path(cfg.ndevices, cfg.mp_keep)[0]] if sim is not None and sim.inp is not None
               else []))
    batch = int(sim.compute.meta.get("batch_size") or 4096) if sim else 4096
    if cfg.measure or cfg.calibrate is not None:
        check_measure_budget(tl, batch, cfg.ndevices)
    print(f"{len(tl.names)} tables from {tl.source}, {tl.task.total_size_gb():.4f} GB in all; "
          f"{cfg.ndevices} devices x {cfg.max_mem:g} GB; --alg {cfg.alg}")
    if tl.defaulted_reuse:
        print(f"note: {len(tl.defaulted_reuse)} table(s) had no reuse statistics (bin_0..bin_16): filled with the "
              f"published DLRM reuse histogram ({', '.join(tl.defaulted_reuse[:5])}"
              f"{', ...' if len(tl.defaulted_reuse) > 5 else ''})")
    return PlanInputs(tl, sim, paths, batch)


def build_simulator(cfg: ShardTablesConfig, cluster: Cluster, inputs: PlanInputs
                    ) -> tuple[Simulator | None, dict | None, object]:
    """Step 2: (the simulator to plan with, its calibration report or None, the hardware or None). The hardware
    is resolved where something is measured or a calibration beside --out may be reused."""
    sim, hw, calibration = inputs.sim, None, None
    if cfg.measure or cfg.calibrate is not None or (sim and calibration_path(cfg.out).is_file()):
        gpu_ids = cfg.hardware.gpu_ids
        hw = resolve_hardware(cfg.hardware.device, cfg.hardware.backend, gpu_ids)
        rank_gpus(hw.device, cfg.ndevices, gpu_ids)  # too few GPUs for the ranks: one line, before any measuring
    if sim is not None and hw is not None:
        sim, calibration = calibrated_simulator(sim, inputs.tables, cluster, hw, inputs.batch, inputs.model_paths,
                                                cfg)
        sim = sim.with_members(inputs.sim.members)
    if sim is not None:
        sim = sim.with_cost(cfg.cost)
        calibrated = f" (calibrated on these tables: {calibration_path(cfg.out)})" if calibration is not None else ""
        print(f"cost models: {', '.join(str(p) for p in inputs.model_paths)}{calibrated}; plans scored by the "
              f"simulated {cfg.cost} cost")
        note = sim.input_model_note()
        if note:
            print(note)
    return sim, calibration, hw


def plan_and_write(cfg: ShardTablesConfig, cluster: Cluster, inputs: PlanInputs, sim: Simulator | None,
                   calibration: dict | None, hw, models_fix: str) -> dict:
    """Steps 3 to 5: choose, print, measure (--measure), write; returns what was planned."""
    tl, batch = inputs.tables, inputs.batch
    if cfg.sharding_types is not None:  # every sharding type: NeuroShardPlanner plans (`all_types.py`)
        return plan_all_types(cfg, cluster, tl, sim, batch, inputs.model_paths)
    search_s, chosen = choose(cfg, cluster, inputs, sim)
    how = "predicted at batch " + str(batch) + " by the cost models" if sim else "no cost models"
    print_plan(f"\nper device ({how}; * = critical device), planned in {search_s:.2f} s", tl, chosen.plan,
               cluster, chosen.cost, sim)
    measured, written = None, chosen
    if cfg.measure:
        measured, written = measure_best(cfg, cluster, inputs, sim, hw, calibration, chosen, models_fix)
    replaced = written.plan is not chosen.plan
    if replaced:
        print_plan(f"\nwritten plan: the measured best ({written.names}); per device and per table:", tl,
                   written.plan, cluster, written.cost, sim)
    spec = plan_spec(tl.names, tl.rows, tl.task.dims, written.plan)
    write_outputs(cfg, plan_record(cfg, inputs, sim, written, spec, calibration, measured, replaced), spec, tl)
    report = {"plan": written.plan, "tables": tl, "cost": written.cost, "spec": spec, "simulator": sim}
    if measured is not None:
        report["measured"] = measured
    return report


def choose(cfg: ShardTablesConfig, cluster: Cluster, inputs: PlanInputs, sim: Simulator | None
           ) -> tuple[float, Chosen]:
    """Step 3: (the search's seconds, the plan chosen to hand out): `--alg`'s plan; without --measure,
    NeuroShard's plan or a cheaper baseline's (`neuroshard_or_better`), its predicted cost checked."""
    tl, batch = inputs.tables, inputs.batch
    sharder = make_sharder(cfg.alg, cfg.seed, sim, cfg.search, batch)
    res = shard_task(sharder, tl.task, cluster)
    if getattr(sharder, "note", None):  # the search's thresholds widened for a block that must stay whole
        print(sharder.note)
    if res.plan is None or res.oom:
        raise UserError(no_plan_line(cfg.alg, res.plan, tl, cluster))
    plan, names = res.plan, cfg.alg
    if cfg.alg == "neuroshard" and not cfg.measure:
        plan, names = neuroshard_or_better(tl, cluster, sim, cfg.search, batch, cfg.seed, plan,
                                           MIN_GAIN if cfg.min_gain is None else cfg.min_gain)
    cost = sim.plan_cost(tl.task, plan).check(f"{names}'s plan") if sim else None
    return res.search_s, Chosen(plan, names, cost)


def measure_best(cfg: ShardTablesConfig, cluster: Cluster, inputs: PlanInputs, sim: Simulator | None, hw,
                 calibration: dict | None, chosen: Chosen, models_fix: str) -> tuple[dict, Chosen]:
    """Step 4 (--measure): the candidates measured in interleaved rounds; (the measurement record, the measured
    best). The measured best is `chosen` itself (under the names it was measured as) where it is the same plan,
    else a new plan with its predicted cost, or with none where the models predict one that cannot be true."""
    tl, batch = inputs.tables, inputs.batch
    budget_s, top_k = cfg.measure_settings()
    mcfg = MeasureConfig(budget_s=budget_s, warmup_iter=cfg.warmup_iter, num_iter=cfg.num_iter, top_k=top_k,
                         seed=cfg.seed, mp_keep=cfg.mp_keep, race=not cfg.no_race, engine=cfg.measure_engine,
                         cost=cfg.cost)
    # the emulated engine measures the step cost itself, not TorchRec's step the fit was made to (an affine,
    # increasing fit: the same candidates in the same order)
    msim = sim.with_step_fit(None) if sim is not None and cfg.measure_engine == "emulated" else sim
    cands = candidate_plans(tl.task, cluster, msim, cfg.search, batch, top_k, cfg.seed,
                            extra={} if cfg.alg == "neuroshard" else {cfg.alg: chosen.plan})
    measured = measure_candidates(tl, cluster, cands, hw, batch, mcfg, cfg.ids, calibration=calibration)
    check_measured_rows(measured["candidates"])
    best = cands[measured["best_index"]]
    names = "/".join(best.names)
    if plan_key(best.plan) == plan_key(chosen.plan):
        return measured, Chosen(chosen.plan, names, chosen.cost)
    cost = sim.plan_cost(tl.task, best.plan) if sim else None
    found = None if cost is None else cost.implausible()
    if found:  # the plan was chosen by measuring it: keep it, and the measurements, without the prediction
        print(f"warning: the cost models predict a {found[0]} cost that cannot be true ({found[1]}) for the "
              f"measured best {names}; its predicted cost is not written ({models_fix})", file=sys.stderr)
        cost = None
    return measured, Chosen(best.plan, names, cost)


def plan_record(cfg: ShardTablesConfig, inputs: PlanInputs, sim: Simulator | None, written: Chosen, spec: dict,
                calibration: dict | None, measured: dict | None, replaced: bool) -> dict:
    """plan.json: the plan written, its predicted (and measured) costs, and what made it."""
    tl = inputs.tables
    record = {"kind": PLAN_KIND, "alg": written.names if replaced else cfg.alg, "chosen": written.names,
              "cost": cfg.cost if sim else None, "ndevices": cfg.ndevices, "max_mem_gb": cfg.max_mem,
              "splits": written.plan.splits,
              "tables": [{**t, "pooling_factor": float(tl.task.pooling_factors[i])} for i, t in
                         enumerate(spec["tables"])],
              "predicted": predicted_record(written.cost, inputs.batch),
              "reuse_defaulted": tl.defaulted_reuse,
              "provenance": provenance(source=tl.source, models=[str(p) for p in inputs.model_paths] if sim else None,
                                       seed=cfg.seed, search=cfg.search.__dict__, mp_keep=cfg.mp_keep)}
    if calibration is not None:
        record["calibration"] = calibration
    if measured is not None:
        record["measured"] = {k: v for k, v in measured.items() if k != "best_index"}
    return record


def write_outputs(cfg: ShardTablesConfig, record: dict, spec: dict, tl: TableList) -> None:
    """Step 5: plan.json, and the TorchRec plan (`write_plan_outputs`)."""
    write_plan_outputs(cfg.out, record, cfg.torchrec_plan, spec, alg=cfg.alg, source=tl.source)


def no_plan_line(alg: str, plan, tl: TableList, cluster: Cluster) -> str:
    """Why `--alg alg` gave no plan within the devices' memory, and what to change: a plan given in a file
    (plan:FILE) is the user's own, so the line says how much memory it needs instead of naming another --alg."""
    if alg.startswith(PLAN_PREFIX) and plan is not None:
        need = float(plan.device_mem_gb(tl.task).max())
        return (f"the plan in {alg[len(PLAN_PREFIX):]} needs {need:.4g} GB on its fullest device, more than --max_mem "
                f"{cluster.max_mem_gb:g}; raise --max_mem to at least {need:.4g}, or give a plan that fits")
    other = "" if alg == "neuroshard" or alg.startswith(PLAN_PREFIX) else ", or try --alg neuroshard"
    return (f"--alg {alg} found no plan within {cluster.num_devices} x {cluster.max_mem_gb:g} GB for "
            f"{tl.task.total_size_gb():.3f} GB of tables; raise --max_mem or add devices{other}")



def neuroshard_or_better(tl: TableList, cluster: Cluster, sim, search, batch: int, seed: int, plan,
                         min_gain: float = 0.0):
    """NeuroShard's plan, unless the simulator rates TorchRec's or a heuristic's plan of the same tables faster, or
    rates the fastest less than `min_gain` cheaper than TorchRec's (`best_simulated`): then that one. Prints the
    comparison; returns (plan, the names it goes by)."""
    best, ranked = against_baselines(tl.task, cluster, sim, search, batch, plan, seed, min_gain=min_gain)
    cells = [["/".join(c.names), "-" if c.simulated_ms is None else f"{c.simulated_ms:.3f}"] for c in ranked]
    print(f"\nNeuroShard's plan against TorchRec's and the heuristics' (simulated {sim.cost} cost, ms):")
    print("\n".join(format_table(["plan", "simulated ms"], cells, style="text", align="lr")))
    print("\n" + handout_verdict(best, ranked, min_gain))
    return (plan, "neuroshard") if "neuroshard" in best.names else (best.plan, "/".join(best.names))



def check_measured_rows(rows: list[dict]) -> None:
    """Measured costs before they are written as results: each candidate's cost and parts plausible
    (`implausible_ms`); a timer or rank that failed gives one line, not a plan chosen on numbers that cannot be."""
    for r in rows:
        parts = r.get("measured_parts_ms")
        for values, positive in ((r["measured_ms"], True), (parts, False)):
            why = None if values is None else implausible_ms(values, positive)
            if why:
                raise UserError(f"--measure measured a cost that cannot be true for {'/'.join(r['names'])} ({why}): "
                                "a timer or rank failed; rerun the same command")
