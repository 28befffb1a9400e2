"""Plan a user's own tables (tools/shard_tables.py): table list in, plan out, handed to TorchRec.

`shard_tables` reads the tables (`--tables` CSV/JSON or `--ids` raw DLRM ids), shards them with any
`--alg` (NeuroShard by default, with the pre-trained cost models), prints the plan per device and
per table, writes `--out plan.json`, and optionally
- `--torchrec_plan FILE`: the plan as a TorchRec `ShardingPlan` spec (see `torchrec_export`);
- `--calibrate K`: fine-tunes the cost models on K measured shards of these tables first
  (`calibrate.py`), saved beside `--out` and reused by later runs on the same tables and hardware;
- `--measure`: measures NeuroShard's top distinct plans, the greedy heuristics' and TorchRec's in
  interleaved rounds and writes the measured best (`measure.py`).
"""
from __future__ import annotations

import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from ..core.artifacts import OutputLock, check_outputs, fresh_path, provenance, read_json, write_json
from ..core.config import MIN_GAIN, ShardTablesConfig
from ..core.errors import UserError
from ..core.tables import format_table
from ..core.types import Cluster, Cost, ImplausibleCost, implausible_ms
from ..data.table_list import TableList, load_table_list, tables_from_ids
from ..sharding.plan import Placement
from ..sharding.plan_file import PLAN_KIND, PREFIX as PLAN_PREFIX
from ..sharding.registry import expand_algs, make_sharder, shard_task
from ..sharding.search import plan_key
from ..sharding.simulator import Simulator
from ..hardware.backends import resolve_hardware
from ..hardware.launch import rank_gpus
from .calibrate import (CALIBRATION_SUFFIX, CalibrationConfig, calibrate, calibration_inputs, calibration_path,
                        find_calibration, save_calibration)
from .measure import MeasureConfig, candidate_plans, check_batch_divides, measure_candidates
from ..sharding.torchrec_export import SPEC_KIND, plan_spec, to_torchrec_plan, write_torchrec_plan

MEASURE_LIMIT_GB = 4.0  # --measure / --calibrate allocate every table: refuse more than this in total
MEASURE_MAX_LOOKUPS = 64_000_000  # ids per batch they may synthesise (~64 B each in all processes: ~4 GB)
MEASURE_BYTES_PER_LOOKUP = 64


def device_report(tl: TableList, plan: Placement, cluster: Cluster, cost: Cost | None) -> str:
    mem = plan.device_mem_gb(tl.task)
    per_dev = plan.per_device()
    crit = cost.critical_device if cost else None
    rows = []
    for r in range(cluster.num_devices):
        c = ([f"{cost.compute_ms[r]:.3f}", f"{cost.fw_ms[r]:.3f}", f"{cost.bw_ms[r]:.3f}",
              f"{cost.per_device_ms[r]:.3f}"] if cost else ["-"] * 4)
        rows.append([f"{r}{' *' if r == crit else ''}", f"{mem[r]:.4f} / {cluster.max_mem_gb:g}", str(len(per_dev[r])),
                     *c])
    lines = format_table(["device", "memory (GB)", "shards", "compute (ms)", "fw comm (ms)", "bw comm (ms)",
                          "total (ms)"], rows, style="text")
    fit = cost.step_fit if cost is not None else None
    if fit is not None:
        lines.append(f"total = (compute + fw + bw) x {fit.scale:.3f} + {fit.overhead_ms:.2f} ms: the step cost "
                     "fitted to TorchRec training steps measured on these ranks (--calibrate_dmp)")
    return "\n".join(lines)


def table_report(tl: TableList, plan: Placement) -> str:
    rows = []
    for t, name in enumerate(tl.names):
        shards = sorted((s.col_start, s.dim, d) for s, d in zip(plan.shards, plan.device_of) if s.table == t)
        ranges: list[list[int]] = []  # adjacent shards on one device shown as one column range
        for c, w, d in shards:
            if ranges and ranges[-1][2] == d and ranges[-1][1] == c:
                ranges[-1][1] = c + w
            else:
                ranges.append([c, c + w, d])
        rows.append([name, str(tl.rows[t]), str(int(tl.task.dims[t])), str(len(shards)),
                     ",".join(str(d) for d in sorted({d for _, _, d in shards})),
                     " ".join(f"{lo}:{hi}@{d}" for lo, hi, d in ranges)])
    return "\n".join(format_table(["table", "rows", "dim", "shards", "devices", "columns@device"], rows, style="text"))


def _predicted(cost: Cost | None, batch: int) -> dict | None:
    if cost is None:
        return None
    out = {"batch_size": batch, "cost_ms": cost.cost_ms, "compute_ms": cost.compute_ms.tolist(),
           "fw_ms": cost.fw_ms.tolist(), "bw_ms": cost.bw_ms.tolist()}
    if cost.step_fit is not None:
        out["step_fit"] = cost.step_fit.to_dict()
    return out


def _coverage_note(sim: Simulator | None, plan, cost) -> None:
    note = sim.comm_coverage_note(plan.device_dim_sums(), cost) if sim is not None and cost is not None else None
    if note:
        print(note)


def _held_out(rep, what: str) -> str:
    """'; <what> before% -> after%' from a calibration report's part, or '' where it holds no such numbers."""
    try:
        return f"; {what} {100 * float(rep['before']['mape']):.1f}% -> {100 * float(rep['after']['mape']):.1f}%"
    except (TypeError, KeyError, ValueError):
        return ""


def calibrated_simulator(sim: Simulator, tl: TableList, cluster: Cluster, hw, batch: int, paths,
                         cfg: ShardTablesConfig) -> tuple[Simulator, dict | None]:
    """The simulator to plan with: calibrated models beside `--out` when they were made for these tables, this
    hardware and these models (reused), newly calibrated ones with `--calibrate K`, else the pre-trained models."""
    path = calibration_path(cfg.out)
    inputs = calibration_inputs(tl.task, hw.describe(), batch, cluster.num_devices, cluster.max_mem_gb, paths,
                                cfg.ids)
    try:
        found, differ = find_calibration(path, inputs, tl.task, cluster)
    except UserError as e:  # damaged, edited or foreign: refused, but it must not block the run that replaces it
        if cfg.calibrate is None:
            raise UserError(f"{e} (--calibrate K replaces it)") from None
        found, differ = None, []
        print(f"note: replacing {path}, which is not a usable calibration: {e}")
    ccfg = None if cfg.calibrate is None else \
        CalibrationConfig(num_shards=cfg.calibrate, comm_layouts=cfg.comm_layouts(), seed=cfg.seed,
                          dmp_plans=cfg.calibrate_dmp or 0)
    if found is not None and (ccfg is None or found[1].get("config") == asdict(ccfg)):
        step = found[1].get("step") if found[0].step_fit else None
        print(f"reusing the calibrated cost models in {path} (same tables, hardware and models"
              f"{_held_out(found[1].get('compute'), 'held-out compute MAPE')}"
              f"{_held_out(step, 'the step cost fitted to TorchRec steps, held-out MAPE')})")
        return found[0], {k: v for k, v in found[1].items() if k != "provenance"}
    other = (f"was calibrated for other tables, hardware or models ({', '.join(differ)} differ)" if differ else
             "was calibrated with another --calibrate K, --calibrate_comm, --calibrate_dmp or --seed")
    if cfg.calibrate is None:
        if differ:
            print(f"note: {path} {other}; not used (pass --calibrate K to replace it)")
        return sim, None
    if found is not None or differ:
        print(f"note: replacing {path}, which {other}")
    calibrated, report = calibrate(sim, tl, cluster, hw, batch, ccfg, cfg.ids)
    report["made_for"] = inputs
    saved = save_calibration_somewhere(path, calibrated, report, cfg)
    report["saved_to"] = None if saved is None else str(saved)
    return calibrated, {k: v for k, v in report.items() if k not in ("provenance", "made_for")}


def save_calibration_somewhere(path: Path, calibrated: Simulator, report: dict, cfg: ShardTablesConfig) -> Path | None:
    """Save a new calibration beside `--out`; when that write fails (a full disk) save it in the temporary folder
    instead, and failing that keep it for this run only (its measurements still go into the plan file). Minutes
    of measuring are never lost to a failed save: one line says what was saved where. Returns where, or None."""
    try:
        save_calibration(path, calibrated, report)
        print(f"calibrated cost models saved to {path}")
        return path
    except UserError as e:
        why = "disk full" if str(e).startswith("disk full") else str(e).split(";")[0]
    spare = fresh_path(Path(tempfile.gettempdir()) / f"neuroshard-{path.name}", "")
    try:
        save_calibration(spare, calibrated, report)
        print(f"warning: could not save the calibration to {path} ({why}); saved it to {spare} instead and planned "
              f"with it: move it back (mv {spare} {path}) and later runs reuse it", file=sys.stderr)
        return spare
    except UserError:
        print(f"warning: could not save the calibration to {path} ({why}) nor to {spare}: planned with it, and its "
              f"measurements go into {cfg.out} (calibration.measured); free some space and rerun with --calibrate "
              f"{cfg.calibrate} to save it", file=sys.stderr)
        return None


def shard_tables(cfg: ShardTablesConfig) -> dict:
    """Plan the user's tables with `cfg.alg`, print the plan, write it (and optionally measure it)."""
    cfg.check()
    alg, ndevices, max_mem, seed, search = cfg.alg, cfg.ndevices, cfg.max_mem, cfg.seed, cfg.search
    cluster = Cluster(ndevices, max_mem)
    if alg == "all" or expand_algs([alg]) != [alg]:
        raise UserError(f"--alg takes one algorithm here, got {alg!r}")
    if cfg.measure:
        cluster.need_peers()
    with OutputLock(check_run_outputs(cfg)):
        return _shard_tables(cfg, cluster)


CALIBRATION_LABEL = "the calibration file beside --out"


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


def _shard_tables(cfg: ShardTablesConfig, cluster: Cluster) -> dict:
    alg, ndevices, max_mem, out = cfg.alg, cfg.ndevices, cfg.max_mem, cfg.out
    if cfg.tables is not None:
        tl = load_table_list(cfg.tables, max_mem)
    else:
        tl = tables_from_ids(cfg.ids, list(cfg.dims), max_mem)
    sim = Simulator.from_files(cfg.models, ndevices, cfg.mp_keep,
                               required=alg == "neuroshard" or cfg.calibrate is not None)
    # the model files a calibration depends on: the input-distribution model too where one is used
    paths = (*cfg.models.paths(ndevices, cfg.mp_keep),
             *([cfg.models.input_path(ndevices, cfg.mp_keep)[0]] if sim is not None and sim.inp is not None else []))
    batch = int(sim.compute.meta.get("batch_size") or 4096) if sim else 4096
    if cfg.measure or cfg.calibrate is not None:
        check_measure_budget(tl, batch, ndevices)
    print(f"{len(tl.names)} tables from {tl.source}, {tl.task.total_size_gb():.4f} GB in all; "
          f"{ndevices} devices x {max_mem:g} GB; --alg {alg}")
    if tl.defaulted_reuse:
        print(f"note: {len(tl.defaulted_reuse)} table(s) had no reuse statistics (bin_0..bin_16): filled with the "
              f"published DLRM reuse histogram ({', '.join(tl.defaulted_reuse[:5])}"
              f"{', ...' if len(tl.defaulted_reuse) > 5 else ''})")
    hw, calibration = None, None
    if cfg.measure or cfg.calibrate is not None or (sim and calibration_path(out).is_file()):
        gpu_ids = cfg.hardware.gpu_ids
        hw = resolve_hardware(cfg.hardware.device, cfg.hardware.backend, gpu_ids)
        rank_gpus(hw.device, ndevices, gpu_ids)  # too few GPUs for the ranks: one line, before any measuring
    if sim is not None and hw is not None:
        sim, calibration = calibrated_simulator(sim, tl, cluster, hw, batch, paths, cfg)
    if sim is not None:
        sim = sim.with_cost(cfg.cost)
        calibrated = f" (calibrated on these tables: {calibration_path(out)})" if calibration is not None else ""
        print(f"cost models: {', '.join(str(p) for p in paths)}{calibrated}; plans scored by the simulated "
              f"{cfg.cost} cost")
        note = sim.input_model_note()
        if note:
            print(note)
    models = _models_words(cfg, calibration)
    try:
        return _plan_and_write(cfg, cluster, tl, sim, paths, batch, calibration, hw, models[1])
    except ImplausibleCost as e:  # anywhere a predicted cost would be printed, compared or written
        raise UserError(e.line(*models)) from None


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


def _models_words(cfg: ShardTablesConfig, calibration: dict | None) -> tuple[str, str]:
    """(the models that predict, how to fix them) for the line of a predicted cost that cannot be true."""
    if calibration is not None:
        fix = f"delete {calibration_path(cfg.out)} and calibrate again (--calibrate K)"
        return "the calibrated cost models", fix + ("" if cfg.alg == "neuroshard" else
                                                     "; or plan without cost models (e.g. --alg size_lookup_greedy)")
    return "the cost models", ("retrain them on more cost data or fine-tune them to these tables (--calibrate K); "
                               "or plan without cost models (e.g. --alg size_lookup_greedy)")


def _plan_and_write(cfg: ShardTablesConfig, cluster: Cluster, tl: TableList, sim, paths, batch: int,
                    calibration: dict | None, hw, models_fix: str) -> dict:
    alg, ndevices, max_mem, seed, search = cfg.alg, cfg.ndevices, cfg.max_mem, cfg.seed, cfg.search
    out, torchrec_plan = cfg.out, cfg.torchrec_plan
    sharder = make_sharder(alg, seed, sim, search, batch)
    res = shard_task(sharder, tl.task, cluster)
    if getattr(sharder, "note", None):  # the search's thresholds widened for a block that must stay whole
        print(sharder.note)
    if res.plan is None or res.oom:
        raise UserError(no_plan_line(alg, res.plan, tl, cluster))
    plan = res.plan
    chosen = alg
    if alg == "neuroshard" and not cfg.measure:
        plan, chosen = neuroshard_or_better(tl, cluster, sim, search, batch, seed, plan,
                                            MIN_GAIN if cfg.min_gain is None else cfg.min_gain)
    cost = sim.plan_cost(tl.task, plan).check(f"{chosen}'s plan") if sim else None
    print(f"\nper device ({'predicted at batch ' + str(batch) + ' by the cost models' if sim else 'no cost models'}"
          f"; * = critical device), planned in {res.search_s:.2f} s")
    print(device_report(tl, plan, cluster, cost))
    print("\nper table\n" + table_report(tl, plan))
    _coverage_note(sim, plan, cost)
    spec = plan_spec(tl.names, tl.rows, tl.task.dims, plan)
    record = {"kind": PLAN_KIND, "alg": alg, "chosen": chosen, "cost": cfg.cost if sim else None, "ndevices": ndevices, "max_mem_gb": max_mem, "splits": plan.splits,
              "tables": [{**t, "pooling_factor": float(tl.task.pooling_factors[i])} for i, t in enumerate(spec["tables"])],
              "predicted": _predicted(cost, batch),
              "reuse_defaulted": tl.defaulted_reuse,
              "provenance": provenance(source=tl.source, models=[str(p) for p in paths] if sim else None,
                                       seed=seed, search=search.__dict__, mp_keep=cfg.mp_keep)}
    if calibration is not None:
        record["calibration"] = calibration
    report = {"plan": plan, "tables": tl, "cost": cost, "spec": spec, "simulator": sim}  # sim: what planned it
    if cfg.measure:
        budget_s, top_k = cfg.measure_settings()
        mcfg = MeasureConfig(budget_s=budget_s, warmup_iter=cfg.warmup_iter, num_iter=cfg.num_iter,
                             top_k=top_k, seed=seed, mp_keep=cfg.mp_keep, race=not cfg.no_race,
                             engine=cfg.measure_engine, cost=cfg.cost)
        # the emulated engine measures the step cost itself, not TorchRec's step the fit was made to (an affine,
        # increasing fit: the same candidates in the same order)
        msim = sim.with_step_fit(None) if sim is not None and cfg.measure_engine == "emulated" else sim
        cands = candidate_plans(tl.task, cluster, msim, search, batch, top_k, seed,
                                extra={} if alg == "neuroshard" else {alg: plan})
        measured = measure_candidates(tl, cluster, cands, hw, batch, mcfg, cfg.ids,
                                      reference=(calibration or {}).get("reference"),
                                      dmp_reference=((calibration or {}).get("measured") or {}).get("dmp"))
        check_measured_rows(measured["candidates"])
        best = cands[measured["best_index"]]
        report["measured"] = measured
        record["chosen"] = "/".join(best.names)
        if plan_key(best.plan) != plan_key(plan):
            plan = best.plan
            cost = sim.plan_cost(tl.task, plan) if sim else None
            found = None if cost is None else cost.implausible()
            if found:  # the plan was chosen by measuring it: keep it, and the measurements, without the prediction
                print(f"warning: the cost models predict a {found[0]} cost that cannot be true ({found[1]}) for the "
                      f"measured best {'/'.join(best.names)}; its predicted cost is not written ({models_fix})",
                      file=sys.stderr)
                cost = None
            print(f"\nwritten plan: the measured best ({'/'.join(best.names)}); per device and per table:")
            print(device_report(tl, plan, cluster, cost))
            print("\nper table\n" + table_report(tl, plan))
            _coverage_note(sim, plan, cost)
            spec = plan_spec(tl.names, tl.rows, tl.task.dims, plan)
            record.update(alg="/".join(best.names), splits=plan.splits, tables=[
                {**t, "pooling_factor": float(tl.task.pooling_factors[i])} for i, t in enumerate(spec["tables"])],
                predicted=_predicted(cost, batch))
            report.update(plan=plan, cost=cost, spec=spec)
        record["measured"] = {k: v for k, v in measured.items() if k != "best_index"}
    write_json(out, record)
    print(f"\nplan written to {out}")
    if torchrec_plan:
        to_torchrec_plan(spec)  # TorchRec must accept it before the file is written
        write_torchrec_plan(torchrec_plan, spec, alg=alg, source=tl.source)
        print(f"TorchRec plan written to {torchrec_plan} (load it with "
              "neuroshard.sharding.torchrec_export.load_torchrec_plan)")
    return report


def neuroshard_or_better(tl: TableList, cluster: Cluster, sim, search, batch: int, seed: int, plan,
                         min_gain: float = 0.0):
    """NeuroShard's plan, unless the simulator rates TorchRec's or a heuristic's plan of the same tables faster, or
    rates the fastest less than `min_gain` cheaper than TorchRec's (`best_simulated`): then that one. Prints the
    comparison; returns (plan, the names it goes by)."""
    from ..sharding.candidates import against_baselines, handout_verdict

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


def check_measure_budget(tl: TableList, batch: int, ndevices: int = 1) -> None:
    """Before any work: --measure and --calibrate split the batch over the ranks, allocate every table and
    synthesise batch x pooling factor ids per table; refuse, with the numbers, a batch the ranks do not divide,
    more than MEASURE_LIMIT_GB of tables or MEASURE_MAX_LOOKUPS ids."""
    check_batch_divides(batch, ndevices)
    if tl.task.total_size_gb() > MEASURE_LIMIT_GB:
        raise UserError(f"--measure allocates every table on this machine: {tl.task.total_size_gb():.2f} GB is more "
                        f"than {MEASURE_LIMIT_GB:g} GB; measure a scaled-down copy of the table list")
    per_table = batch * tl.task.pooling_factors
    lookups = float(per_table.sum())
    if lookups > MEASURE_MAX_LOOKUPS:
        t = int(per_table.argmax())
        raise UserError(f"--measure would synthesise {lookups / 1e6:,.1f} M ids for a batch of {batch} (about "
                        f"{lookups * MEASURE_BYTES_PER_LOOKUP / 2**30:,.1f} GB while they are made and measured; "
                        f"{tl.names[t]!r} alone {per_table[t] / 1e6:,.1f} M at pooling factor "
                        f"{tl.task.pooling_factors[t]:g}), more than the budget of {MEASURE_MAX_LOOKUPS / 1e6:g} M; "
                        "lower the pooling factors or measure fewer tables")
