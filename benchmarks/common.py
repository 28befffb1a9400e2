"""What several benchmarks share, imported as `common` (a script's own folder is first on its import path).

- `SETS`: the cited table sets of benchmarks/real_tables/ and the row scale that fits each to the quick
  preset's devices; `check_sets` refuses a name that is not one, `scaled_table_list` writes one scaled;
- `speed_probe_ms`: how fast this machine is right now, taken before and after a long measurement;
- `resolved_pairs`: of the pairs of plans a measurement tells apart, how many a prediction orders the same way;
- `measure_task_plans`: each task's plans measured interleaved on the engine, each distinct plan once;
- `finished_run_plans`: the dataset, test tasks and measured plans of a finished pipeline run.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from neuroshard.core.artifacts import write_json
from neuroshard.core.costs import check_max_mem_gb
from neuroshard.core.errors import PlanError, UserError, check_int
from neuroshard.core.file_names import DATASET_DIR, RESULTS_DIR, TASKS_DIR, eval_results_path, tasks_path
from neuroshard.core.intervals import paired_interval
from neuroshard.hardware.engine import measure_plans, plan_device_tables
from neuroshard.sharding.plan import Placement
from neuroshard.sharding.search import plan_key

SETS_DIR = Path(__file__).resolve().parent / "real_tables"
SETS = {"criteo_kaggle": 0.05, "criteo_terabyte_mlperf": 0.001, "criteo_multihot_mlperf_dcnv2": 0.001,
        "taobao_ad_x1_din": 0.5}


def check_engine_flags(cfg) -> None:
    """The flags of a benchmark that measures plans on the emulated engine: --ndevices, --rounds, --warmup_iter,
    --num_iter and --max_mem, each the benchmark has in its range (one line naming the first that is not)."""
    for name, lo, hi in (("ndevices", 2, 64), ("rounds", 2, 1000), ("warmup_iter", 0, 10_000),
                         ("num_iter", 1, 100_000)):
        if hasattr(cfg, name):
            check_int(f"--{name}", getattr(cfg, name), lo, hi)
    if hasattr(cfg, "max_mem"):
        check_max_mem_gb(cfg.max_mem)


def check_sets(names) -> None:
    """--sets: every name one of `SETS`, else one line naming the first that is not."""
    unknown = [s for s in names if s not in SETS]
    if unknown:
        raise UserError(f"--sets: unknown table set {unknown[0]!r}; choose from {', '.join(SETS)}")


def scaled_table_list(name: str, row_scale: float, out: Path) -> Path:
    """The cited set with rows x row_scale (tables of <= 100 rows unchanged), as a table-list JSON."""
    obj = json.loads((SETS_DIR / f"{name}.json").read_text())
    for t in obj["tables"]:
        t["rows"] = t["rows"] if t["rows"] <= 100 else max(100, int(round(t["rows"] * row_scale)))
    obj["row_scale"] = row_scale
    write_json(out, obj, indent=None)
    return out


def table_list_ebc(tl):
    """The module a TorchRec user would plan for a table list (`neuroshard.planning.all_types.table_list_module`)."""
    from neuroshard.planning.all_types import table_list_module

    return table_list_module(tl)


def speed_probe_ms(repeats: int = 15) -> float:
    """Median ms of ten 512 x 512 float32 matmuls on one CPU thread: how fast this machine is right now.

    Benchmarks take it before and after a long measurement, so that a run whose machine slowed down in
    between (other tenants on a shared host) shows it; the thread count is restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.randn(512, 512, generator=torch.Generator().manual_seed(0))
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(10):
                a @ a
            times.append(1000.0 * (time.perf_counter() - t0))
        return statistics.median(times)
    finally:
        torch.set_num_threads(threads)


def resolved_pairs(rounds: dict, *predicted: dict, level: float = 0.95) -> tuple[int, ...]:
    """Of the pairs of plans a measurement tells apart, how many each prediction orders the same way.

    rounds: {plan: per-round costs}, the same rounds for every plan (paired); each of `predicted`: {plan: cost}.
    A pair is told apart when the paired interval of its round ratios (`core.intervals.paired_interval`, Student-t
    on the log ratio) excludes 1. Returns (pairs told apart, then per prediction those it orders as measured);
    a predicted tie agrees with no order. Unlike a rank correlation, plans the measurement cannot order do not
    count. Each pair's interval is computed once, whatever the number of predictions."""
    keys = list(rounds)
    told, agree = 0, [0] * len(predicted)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            st = paired_interval(rounds[a], rounds[b], level=level)
            if not (st.lo > 1 or st.hi < 1):
                continue
            told += 1
            for j, p in enumerate(predicted):
                agree[j] += int((p[a] < p[b]) if st.hi < 1 else (p[a] > p[b]))
    return (told, *agree)


def measure_task_plans(settings, tasks, plans_of, num_devices: int, rounds: int, desc: str) -> dict:
    """Each task's plans (`plans_of(task)` -> {kind: plan}; {} leaves the task out) measured in `rounds` rounds on
    the engine `settings` name, a task's plans interleaved and each distinct plan of a task measured once under all
    its kinds: {(task index, kind): (plan, Measured)}."""
    from tqdm import tqdm

    items, kinds = {}, {}
    for t, task in enumerate(tqdm(tasks, desc=f"planning ({desc})", leave=False)):
        for kind, plan in plans_of(task).items():
            key = (t, plan_key(plan))
            items[key] = plan_device_tables(task, plan)
            kinds[(t, kind)] = (key, plan)
    with tqdm(total=len(items), desc=f"measuring ({desc})") as bar:
        got = measure_plans(settings, items, num_devices, rounds, on_result=lambda *_: bar.update(),
                            group_of=lambda key: key[0])
    return {k: (plan, got[key]) for k, (key, plan) in kinds.items()}


def finished_run_plans(work: Path, ndevices: int):
    """(dataset, test tasks, [(task index, alg, Placement, its devices as the CSV lists them)] of the plans step 6
    measured within memory, in the CSV's order) of a finished pipeline run in `work`. A run that is not there, or whose results do not read (a damaged
    row, a plan that is not one of its task), is one line naming the file and the fix."""
    import pandas as pd

    from neuroshard.data.dataset import DLRMDataset
    from neuroshard.data.tasks import load_tasks

    csv = eval_results_path(work / RESULTS_DIR, ndevices)
    if not csv.exists():
        raise UserError(f"no {csv}: run the pipeline in {work} first (make reproduce)")
    again = f"run step 6 again in {work} (make reproduce)"
    try:
        rows = pd.read_csv(csv, dtype=str, keep_default_na=False)
    except Exception as e:  # pandas' parser errors have no common base
        raise UserError(f"{csv} is not a readable CSV ({type(e).__name__}: {str(e)[:120]}); {again}") from None
    missing = [c for c in ("task", "alg", "oom", "plan") if c not in rows.columns]
    if missing:
        raise UserError(f"{csv} has no column {missing[0]!r}: not step 6's results; {again}")
    ds = DLRMDataset.load(work / DATASET_DIR)
    tasks = load_tasks(tasks_path(work / TASKS_DIR, "test"), ds)
    plans = []
    for i, r in enumerate(rows.itertuples()):
        try:
            if r.oom not in ("True", "False") or not 0 <= int(r.task) < len(tasks):
                raise ValueError(f"task {r.task!r}, oom {r.oom!r}")
            if r.oom == "False":
                task, plan = tasks[int(r.task)], json.loads(r.plan)
                plans.append((int(r.task), r.alg, Placement.from_dict(plan, task.dims, ndevices), plan["devices"]))
        except (ValueError, TypeError, KeyError, OverflowError, RecursionError, PlanError) as e:
            raise UserError(f"{csv} row {i + 1} does not read ({type(e).__name__}: {str(e)[:120]}); {again}") from None
    return ds, tasks, plans
