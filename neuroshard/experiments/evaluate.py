"""Steps 5 and 6: shard every task with each algorithm, then score the plans with the simulator
(`eval_simulator`, DESIGN.md §3.4) or measure them on hardware (`eval_hardware`, §3.7).

`eval_hardware` appends every measured plan to a progress log beside the results CSV
(`<csv>.progress.pkl`) the moment it is measured; an interrupted run resumes with the plans not
measured yet (a plan is re-measured only if the algorithm now gives another plan). A progress log
of a run with other settings is started anew; one holding a record that is not a measured plan
(a key missing, a wrong type, a NaN cost) is set aside as `<log>.bad` with one line and its good
records kept; a damaged frame is refused (`--salvage` keeps the good records). Both write one CSV
row per (task, algorithm) plus a provenance sidecar.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..core.artifacts import (RecordLog, check_output_file, check_outputs, check_printable_path, file_digest, fresh_path,
                              provenance, write_results)
from ..core.config import EvalConfig, EvalSimConfig, mp_text
from ..core.errors import UserError
from ..core.file_names import (RESULTS_DIR, eval_results_path, meta_path, progress_path, ratio_results_path,
                               sim_results_path)
from ..core.costs import Cluster, Cost, implausible_ms
from ..data.dataset import DLRMDataset
from ..data.tasks import ShardingTask, load_tasks
from ..hardware.backends import resolve_hardware
from ..hardware.engine import EngineSettings, Measured, measure_plans, plan_device_tables
from ..hardware.launch import rank_gpus
from ..sharding.registry import SEARCHES, algs_file_tag, expand_algs, make_sharders, shard_rows, without_unavailable
from ..sharding.plan_ratios import STATED_BY_RATIO, PlanRatios
from ..sharding.risk import INTERVAL_LEVEL, STATED_BY_SPREAD, predicted_interval
from ..sharding.simulator import Simulator
from .task_summary import print_paired, print_summary, summarize

EVAL_PROGRESS_KIND = "neuroshard.eval_progress"
ARRAY = (list, np.ndarray)


def _load_inputs(data_dir, task_path, cluster: Cluster, batch_size):
    check_printable_path(task_path, "--task_path", "rename the file to printable characters")
    ds = DLRMDataset.load(data_dir)
    batch = ds.check_batch(batch_size)
    return ds, batch, _load_tasks(ds, task_path, cluster)


def _load_tasks(ds: DLRMDataset, task_path, cluster: Cluster) -> list[ShardingTask]:
    """The tasks in `task_path`, each with at least a table per device."""
    tasks = load_tasks(task_path, ds)
    if min(t.num_tables for t in tasks) < cluster.num_devices:
        raise UserError(f"{cluster.num_devices} devices but a task in {task_path} has only "
                        f"{min(t.num_tables for t in tasks)} tables; use fewer --ndevices or larger tasks")
    return tasks


def _simulator(models, ds: DLRMDataset, batch: int, N: int, required: bool, mp_keep: float | None) -> Simulator | None:
    """The cost models (`Simulator.from_files`); when only baselines run they just add each plan's simulated cost, so
    models that are missing or do not match this dataset/batch are skipped with a note instead of refused."""
    try:
        sim = Simulator.from_files(models, N, mp_keep, required)
        if sim is None:
            return None
        sim.check_dataset(ds.fingerprint, batch)
    except UserError as e:
        if required:
            raise
        print(f"note: no simulated costs in the results: {e}")
        return None
    return sim


def _tasks_fingerprint(tasks: list[ShardingTask]) -> str:
    h = hashlib.sha1()
    for t in tasks:
        h.update(np.ascontiguousarray(t.table_ids).tobytes())
        h.update(np.ascontiguousarray(t.dims).tobytes())
        h.update(b"|")
    return h.hexdigest()[:16]


def _progress_problem(r: dict, N: int) -> str | None:
    """Why a progress record is not a measured plan of this run (None when it is one)."""
    for key, kind in (("alg", str), ("task", int), ("plan", (dict, list)), ("compute_ms", ARRAY), ("fw_ms", ARRAY),
                      ("bw_ms", ARRAY), ("round_costs", ARRAY)):
        if key not in r:
            return f"no {key!r}"
        if not isinstance(r[key], kind) or isinstance(r[key], bool):
            return f"{key!r} is a {type(r[key]).__name__}"
    if r.get("split", "") not in ("", "ratio"):  # "ratio": a --ratio_tasks plan (no "split": one under test)
        return f"'split' is {str(r['split'])[:20]!r}"
    try:
        json.dumps(r["plan"])
        costs = [np.asarray(r[k], dtype=np.float64) for k in ("compute_ms", "fw_ms", "bw_ms", "round_costs")]
    except (TypeError, ValueError, RecursionError) as e:
        return f"unreadable values ({type(e).__name__})"
    if any(c.shape != (N,) for c in costs[:3]) or costs[3].ndim != 1 or not costs[3].size:
        return f"costs not of {N} devices"
    if not all(np.isfinite(c).all() and (c >= 0).all() for c in costs):
        return "a cost that is NaN, infinite or negative"
    return None


def checked_cost(cost: Cost, paths, row: dict, negative: list | None = None) -> Cost:
    """A simulated plan cost before it is written as a result. Non-finite or above MAX_PLAUSIBLE_MS
    (`implausible_ms`): one line naming the models that predicted it. Below zero: the evaluation goes on (it
    evaluates the simulator as it is, and one refused plan would end a whole run), and the plan's
    "alg task" is added to `negative` for one warning at the end (`warn_negative`)."""
    found = cost.implausible(negative_parts=True)
    if found:
        raise UserError(f"the cost models ({', '.join(map(str, paths))}) predict a {found[0]} cost that cannot be true "
                        f"({found[1]}) for task {row['task']}'s {row['alg']} plan; retrain them on more cost data "
                        "(train_compute_cost_model.py / train_comm_cost_model.py)")
    if negative is not None and min(cost.compute_ms.min(), cost.fw_ms.min(), cost.bw_ms.min()) < 0:
        negative.append(f"{row['alg']} task {row['task']}")
    return cost


def warn_negative(negative: list, paths) -> None:
    if negative:
        print(f"warning: the cost models ({', '.join(map(str, paths))}) predict a negative cost for {len(negative)} "
              f"plan(s) ({', '.join(negative[:3])}{', ...' if len(negative) > 3 else ''}), written as predicted; they "
              "are barely trained or asked outside their data: retrain them on more cost data", file=sys.stderr)


def _open_progress(path: Path, settings: dict, N: int, salvage: bool) -> RecordLog:
    """The progress log; one holding records that are not measured plans is set aside (`PATH.bad`) with one
    line, and its good records carried into a new log, so a bad log never blocks a rerun."""
    log = RecordLog(path, EVAL_PROGRESS_KIND, {**settings, "provenance": provenance()}, tuple(settings),
                    "eval progress log", restart_on_mismatch=True, salvage=salvage)
    problems = [(i, p) for i, p in ((i, _progress_problem(r, N)) for i, r in enumerate(log.records, 1)) if p]
    if not problems:
        return log
    good = [r for i, r in enumerate(log.records, 1) if i not in dict(problems)]
    log.close()
    aside = fresh_path(path, ".bad")  # an earlier run's .bad file is kept
    os.replace(path, aside)
    print(f"note: {path} record #{problems[0][0]} is not a measured plan ({problems[0][1]}; {len(problems)} such "
          f"record(s)): set the log aside as {aside}, keeping its {len(good)} good record(s); the rest are measured "
          "again", file=sys.stderr)
    log = RecordLog(path, EVAL_PROGRESS_KIND, {**settings, "provenance": provenance()}, tuple(settings),
                    "eval progress log", restart_on_mismatch=True)
    for r in good:
        log.append(r)
    return log


def _plan_ratios(cfg: EvalConfig, sim: Simulator | None, N: int, paths, algs: list[str]) -> tuple[dict, dict | None]:
    """(the algorithms' `PlanRatio`s from --plan_ratios, the file's path and SHA-256 as read, for the provenance;
    ({}, None) without it), checked against these models; a note names the algorithms of this run it has none for
    (their plans keep the models' cost)."""
    if (cfg.plan_ratios or cfg.plan_ratios_out) and sim is None:
        flag = "--plan_ratios" if cfg.plan_ratios else "--plan_ratios_out"
        raise UserError(f"{flag} needs the cost models the plans are rated with ({', '.join(map(str, paths))}); "
                        "train them first (make reproduce does), or leave the flag out")
    if not cfg.plan_ratios:
        return {}, None
    fix = ("name the file python eval.py --task_path <the training tasks> --plan_ratios_out FILE wrote with these "
           "models, or leave out --plan_ratios")
    ratios = PlanRatios.load(cfg.plan_ratios, N, paths, fix).ratios
    read = {"path": cfg.plan_ratios, "sha256": file_digest(cfg.plan_ratios)}
    missing = [a for a in algs if a not in ratios]
    if missing:
        print(f"note: {cfg.plan_ratios} has no ratio for {', '.join(missing)}: their plans are stated at the models' "
              "cost, with the ensemble members' spread as the interval")
    return ratios, read


def _stated(sim: Simulator | None, task, res, sim_ms: float, ratio) -> dict:
    """A plan's stated cost and interval (`pred_level`: the interval's nominal level): from its algorithm's `ratio`
    where --plan_ratios has one, else the models' cost and the ensemble members' spread (`risk.predicted_interval`);
    NaN where neither applies."""
    nan = float("nan")
    if sim is None or res.oom or not np.isfinite(sim_ms):
        return {"pred_ms": nan, "pred_lo_ms": nan, "pred_hi_ms": nan, "pred_level": nan, "stated_by": ""}
    if ratio is not None:
        interval, by, pred = ratio.interval_ms(sim_ms), STATED_BY_RATIO, ratio.stated_ms(sim_ms)
        level = ratio.nominal_level
    else:
        interval, by, pred = predicted_interval(sim, task, res.plan, sim_ms), STATED_BY_SPREAD, sim_ms
        level = INTERVAL_LEVEL
    lo, hi = interval or (nan, nan)
    return {"pred_ms": pred, "pred_lo_ms": lo, "pred_hi_ms": hi, "pred_level": level if interval else nan,
            "stated_by": by}


def eval_simulator(cfg: EvalSimConfig) -> list[dict]:
    """Step 5: simulated cost of every (task, algorithm) plan -> results CSV."""
    cfg.check()
    algs = expand_algs(cfg.alg)
    out = Path(cfg.results_csv or sim_results_path(RESULTS_DIR, algs_file_tag(algs)))
    check_output_file(out, "--results_csv")
    ndevices, max_mem, seed, search, task_path = cfg.ndevices, cfg.max_mem, cfg.seed, cfg.search, cfg.task_path
    if ndevices < 2:  # before the model files, whose "train it" hint cannot be followed for 1 device
        raise UserError(f"--ndevices must be >= 2, got {ndevices}: the simulator's communication cost models exist "
                        "for 2 or more devices (train_comm_cost_model.py --ndevices N, N >= 2)")
    cluster = Cluster(ndevices, max_mem)
    ds, batch, tasks = _load_inputs(cfg.data_dir, task_path, cluster, None)
    paths = cfg.models.paths(ndevices, cfg.mp_keep)
    sim = _simulator(cfg.models, ds, batch, ndevices, required=True, mp_keep=cfg.mp_keep)
    algs = without_unavailable(algs, cfg.alg, sim)
    rows, negative = [], []
    for row, task, res in shard_rows(make_sharders(algs, sim, search, batch, seed), tasks, cluster):
        cost = None if res.oom else checked_cost(sim.plan_cost(task, res.plan, cluster), paths, row, negative)
        row.update(oom=cost is None, cost_ms=cost.cost_ms if cost else float("nan"),
                   compute_ms=cost.compute_ms if cost else None, fw_ms=cost.fw_ms if cost else None,
                   bw_ms=cost.bw_ms if cost else None)
        rows.append(row)
    write_results(out, rows, ndevices=ndevices, max_mem_gb=max_mem, seed=seed, batch_size=batch,
                  task_path=str(task_path), dataset=str(ds.path), models=[str(p) for p in paths], mp_keep=cfg.mp_keep,
                  model_hardware={k: sim.compute.meta.get(k) for k in ("device", "backend", "batch_size")},
                  search=search.__dict__)
    warn_negative(negative, paths)
    summary = summarize(rows, "cost_ms")
    print_summary(summary, f"simulated cost ({len(tasks)} tasks, {ndevices} devices, {max_mem} GB) -> {out}")
    for s in summary:
        print(f"{s['alg']}: average cost {s['mean_cost_ms']:.3f} ms  Valid {s['valid']} / {s['total']}  "
              f"mean search {s['mean_search_s']:.4f} s")
    print_paired(rows, "cost_ms")
    return rows


def _ratio_tasks(cfg: EvalConfig, ds: DLRMDataset, tasks: list[ShardingTask], cluster: Cluster, algs: list[str]
                 ) -> tuple[list, list[str]]:
    """(--ratio_tasks' tasks, the searches of `algs` measured on them); ([], []) without the flag. Tasks that are
    the ones under test (`tasks`: the same file, a link or a copy of it) are refused."""
    if not cfg.ratio_tasks:
        return [], []
    check_printable_path(cfg.ratio_tasks, "--ratio_tasks", "rename the file to printable characters")
    same = (f"--ratio_tasks names the --task_path file ({cfg.task_path}): the ratios would be fitted on the plans "
            "they state; name other tasks (the pipeline's training tasks)")
    if Path(cfg.ratio_tasks).resolve() == Path(cfg.task_path).resolve():
        raise UserError(same)
    searches = [a for a in algs if a in SEARCHES]
    if not searches:
        raise UserError(f"--ratio_tasks states the searches' plans ({', '.join(sorted(SEARCHES))}), and --alg names "
                        "none of them; add one to --alg, or leave out --ratio_tasks")
    try:
        ratio_tasks = _load_tasks(ds, cfg.ratio_tasks, cluster)
    except UserError as e:
        raise UserError(f"--ratio_tasks: {e}") from None
    if _tasks_fingerprint(ratio_tasks) == _tasks_fingerprint(tasks):
        raise UserError(same.replace("names the --task_path file", "holds the very tasks of --task_path"))
    return ratio_tasks, searches


def _interleaved(groups: dict[str, dict[int, dict]]) -> dict:
    """The plans of every group ({split: {task: {key: plan}}}) in one order in which each split's tasks are spread
    evenly over the whole measurement (task i of n at (i + 0.5) / n), so a split measured beside another sees the
    machine's speed of the same minutes."""
    order = sorted(((i + 0.5) / len(tasks), split, t) for split, tasks in groups.items()
                   for i, t in enumerate(tasks))
    return {k: v for _, split, t in order for k, v in groups[split][t].items()}


def eval_hardware(cfg: EvalConfig) -> list[dict]:
    """Step 6: measured cost of every (task, algorithm) plan on hardware -> results CSV (resumable).

    With --ratio_tasks, the searches' plans for those tasks are measured in the same run, spread evenly among the
    plans under test, and each search's measured / modelled ratio over them states its plans here
    (sharding/plan_ratios.py); their rows go to `ratio_results_path(csv)`."""
    cfg.check()
    algs = expand_algs(cfg.alg)
    out = Path(cfg.results_csv or eval_results_path(RESULTS_DIR, algs_file_tag(algs)))
    check_output_file(out, "--results_csv")
    check_output_file(cfg.plan_ratios_out, "--plan_ratios_out")
    gpu_ids = cfg.hardware.gpu_ids
    hw = resolve_hardware(cfg.hardware.device, cfg.hardware.backend, gpu_ids)
    N = cfg.hardware.num_ranks(cfg.ndevices)
    gpu_ids = rank_gpus(hw.device, N, gpu_ids)  # too few GPUs: refused before anything is written
    cluster = Cluster(N, cfg.max_mem).need_peers()
    max_mem, seed, search, task_path = cfg.max_mem, cfg.seed, cfg.search, cfg.task_path
    warmup_iter, num_iter, rounds = cfg.warmup_iter, cfg.num_iter, cfg.rounds
    ds, batch, tasks = _load_inputs(cfg.data_dir, task_path, cluster, cfg.batch_size)
    if batch % N:
        raise UserError(f"the batch of {batch} is not divisible by {N} ranks; pass a --batch_size divisible by {N}")
    ratio_tasks, ratio_algs = _ratio_tasks(cfg, ds, tasks, cluster, algs)
    ratio_out = ratio_results_path(out) if ratio_tasks else None
    paths = cfg.models.paths(N, cfg.mp_keep)
    # every file written, refused now if it could not be, or if it would replace another or an input
    check_outputs({"--results_csv": out, "the results' provenance file": meta_path(out),
                   "the results' progress log": progress_path(out), "--plan_ratios_out": cfg.plan_ratios_out,
                   "the --ratio_tasks results": ratio_out,
                   "the --ratio_tasks results' provenance file": meta_path(ratio_out) if ratio_out else None},
                  {"--task_path": task_path, "--plan_ratios": cfg.plan_ratios, "--ratio_tasks": cfg.ratio_tasks,
                   **{f"cost model {p}": p for p in paths}})
    sim = _simulator(cfg.models, ds, batch, N, required=bool(SEARCHES & set(algs)), mp_keep=cfg.mp_keep)  # also fidelity
    algs = without_unavailable(algs, cfg.alg, sim)
    ratios, ratios_read = _plan_ratios(cfg, sim, N, paths, algs)
    entries, negative = [], []  # (split, row, task, result): split "" for the tasks under test, "ratio" for --ratio_tasks
    groups: dict[str, dict[int, dict]] = {"": {}, "ratio": {}}
    for split, task_list, names in (("", tasks, algs), ("ratio", ratio_tasks, ratio_algs)):
        if not task_list:
            continue
        for row, task, res in shard_rows(make_sharders(names, sim, search, batch, seed), task_list, cluster):
            row["sim_cost_ms"] = checked_cost(sim.plan_cost(task, res.plan), paths, row, negative).cost_ms \
                if sim is not None and not res.oom else float("nan")
            entries.append((split, row, task, res))
            if not res.oom:
                groups[split].setdefault(row["task"], {})[(split, row["alg"], row["task"])] = \
                    (plan_device_tables(task, res.plan), row["plan"])
    plans = _interleaved(groups)
    warn_negative(negative, paths)
    settings = {**hw.describe(), "batch_size": batch, "ndevices": N, "max_mem_gb": float(max_mem),
                "warmup_iter": warmup_iter, "num_iter": num_iter, "rounds": rounds, "mp_keep": cfg.mp_keep,
                "dataset_fingerprint": ds.fingerprint,
                "tasks_fingerprint": _tasks_fingerprint(tasks),
                "ratio_tasks_fingerprint": _tasks_fingerprint(ratio_tasks) if ratio_tasks else None}
    log_path = progress_path(out)
    log = _open_progress(log_path, settings, N, cfg.salvage)
    measured: dict[tuple, Measured] = {}
    try:
        for r in log.records:
            key = (r.get("split", ""), r["alg"], r["task"])
            if key in plans and json.dumps(plans[key][1]) == json.dumps(r["plan"]):
                measured[key] = Measured(r["round_costs"],
                                         parts_ms=np.stack([r["compute_ms"], r["fw_ms"], r["bw_ms"]], axis=1))
        todo = {k: v[0] for k, v in plans.items() if k not in measured}
        n_ratio = sum(1 for k in todo if k[0])
        also = (f" (+ {n_ratio} {', '.join(ratio_algs)} plans of the {len(ratio_tasks)} --ratio_tasks, spread "
                "among them)" if ratio_tasks else "")
        print(f"measuring {len(todo) - n_ratio} plans{also} on {N} ranks ({hw.backend}/{hw.device}, batch {batch}, "
              f"{mp_text(cfg.mp_keep)} all-to-all, each task's plans "
              f"interleaved in {rounds} rounds of {warmup_iter} warm-up + {max(1, num_iter // rounds)} timed iterations)"
              + (f"; {len(measured)} already measured in {log_path}" if measured else ""))

        def on_result(key, m: Measured):
            what = f"{'--ratio_tasks ' if key[0] else ''}task {key[2]}'s {key[1]} plan"
            why = implausible_ms(m.parts.per_device_ms, positive=True) or implausible_ms(m.round_ms, positive=True)
            if why:
                raise UserError(f"{what} measured a cost that cannot be true ({why}): a timer "
                                f"or rank failed; rerun the same command (the {len(log.records)} plans measured "
                                f"before it are kept in {log_path})")
            log.append({"split": key[0], "alg": key[1], "task": key[2], "plan": plans[key][1],
                        "compute_ms": m.compute_ms, "fw_ms": m.fw_ms, "bw_ms": m.bw_ms, "round_costs": list(m.round_ms)})
            measured[key] = m
            bar.update()

        engine = EngineSettings(str(ds.path), hw, batch, warmup_iter, max(1, num_iter // rounds), cfg.mp_keep,
                                shuffle=False)
        with tqdm(total=len(todo), desc="plans") as bar:
            measure_plans(engine, todo, N, rounds, on_result=on_result, gpu_ids=gpu_ids,
                          group_of=lambda key: key[::2])
    finally:
        log.close()
    for split, r, _, _ in entries:
        m = measured.get((split, r["alg"], r["task"]))
        r["cost_ms"] = m.cost_ms if m else float("nan")
        if m:
            rc = m.round_ms
            lo, hi = m.interval()
            r.update(compute_ms=m.compute_ms, fw_ms=m.fw_ms, bw_ms=m.bw_ms, round_costs_ms=rc, cost_ci_lo_ms=lo,
                     cost_ci_hi_ms=hi, spread_pct=float(100 * (rc.max() - rc.min()) / np.median(rc)))
    rows = [r for split, r, _, _ in entries if not split]
    ratio_rows = [r for split, r, _, _ in entries if split]
    made_with = dict(**settings, seed=seed, dataset=str(ds.path), models=[str(p) for p in paths] if sim else None,
                     search=search.__dict__)
    # the ratios fitted here: of the --ratio_tasks plans (they state this run's plans), else of this run's own
    fitted = PlanRatios.fit(ratio_rows if ratio_tasks else rows, N, paths) \
        if ratio_tasks or cfg.plan_ratios_out is not None else None
    if fitted is not None:
        _print_ratios(fitted, f"--ratio_tasks {cfg.ratio_tasks}" if ratio_tasks else str(task_path))
    if ratio_tasks:
        ratios = fitted.ratios
        missing = [a for a in ratio_algs if a not in ratios]
        if missing:
            print(f"note: no --ratio_tasks plan of {', '.join(missing)} has both costs (all out of memory?): its "
                  "plans are stated at the models' cost, with the ensemble members' spread as the interval")
    for split, r, task, res in entries:
        if not split:
            r.update(_stated(sim, task, res, r["sim_cost_ms"], ratios.get(r["alg"])))
    if cfg.plan_ratios_out is not None:  # before the CSV: a run stopped in between measures nothing again
        if not fitted.ratios:
            raise UserError(f"--plan_ratios_out: none of the plans has both a models' cost and a measured cost (every "
                            f"task out of memory at --max_mem {max_mem}?), so there are no ratios to write; give the "
                            "tasks room, or leave out --plan_ratios_out")
        fitted.save(cfg.plan_ratios_out, task_path=str(cfg.ratio_tasks or task_path),
                    results_csv=str(ratio_out or out), **settings)
        print(f"plan ratios -> {cfg.plan_ratios_out}")
    if ratio_tasks:
        write_results(ratio_out, ratio_rows, **made_with, task_path=str(cfg.ratio_tasks))
    write_results(out, rows, **made_with, task_path=str(task_path),
                  plan_ratios=ratios_read or ({"ratio_tasks": cfg.ratio_tasks, "results_csv": str(ratio_out)}
                                              if ratio_tasks else None))
    log_path.unlink(missing_ok=True)  # the CSVs now hold every result
    summary = summarize(rows, "cost_ms")
    print_summary(summary, f"measured cost on hardware ({len(tasks)} tasks) -> {out}")
    for s in summary:
        print(f"{s['alg']}: average cost {s['mean_cost_ms']:.3f} ms  Valid {s['valid']} / {s['total']}")
    print_paired(rows, "cost_ms")
    return rows


def _print_ratios(fitted: PlanRatios, where: str) -> None:
    for alg, r in fitted.ratios.items():
        ends = ("too few plans for an interval" if r.lo is None else
                f"interval x [{r.lo:.3f}, {r.hi:.3f}] (nominal level {r.nominal_level:.1%})")
        print(f"{alg}: measured / modelled cost over {r.plans} plans of {where}: median {r.median:.3f}, {ends}")
