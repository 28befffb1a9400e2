"""Plan a user's own tables (tools/shard_tables.py): table list in, plan out, handed to TorchRec.

`shard_tables` reads the tables (`--tables` CSV/JSON or `--ids` raw DLRM ids), shards them with any
`--alg` (NeuroShard by default, with the pre-trained cost models), prints the plan per device and
per table, writes `--out plan.json`, and optionally
- `--torchrec_plan FILE`: the plan as a TorchRec `ShardingPlan` spec (see `torchrec_export`);
- `--measure`: synthesises ids with the tables' rows, pooling factors and reuse histograms and
  measures the plan on hardware exactly as eval.py does, next to the four greedy heuristics' plans.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from ..core.artifacts import atomic_write_text, check_output_file, provenance
from ..core.config import ShardTablesConfig
from ..core.errors import UserError
from ..core.types import Cluster, Cost
from ..data.table_list import TableList, load_table_list, tables_from_ids
from ..sharding.plan import ShardingPlan
from ..sharding.plan_file import PLAN_KIND
from ..sharding.registry import BASELINES, expand_algs, make_sharder, shard_task
from ..sharding.simulator import Simulator
from ..sharding.torchrec_export import plan_spec, to_torchrec_plan, write_torchrec_plan

MEASURE_LIMIT_GB = 4.0  # --measure allocates every table: refuse more than this in total
HEURISTICS = [a for a in BASELINES if a != "random"]


def _models_hint(N: int) -> str:
    return (f"train them with `make reproduce` (4 devices) or steps 3-4: python collect_compute_cost_data.py && "
            f"python train_compute_cost_model.py && python collect_comm_cost_data.py --ndevices {N} && "
            f"python train_comm_cost_model.py --ndevices {N}; or pass --compute_model/--fw_comm_model/--bw_comm_model")


def _simulator(paths, N: int, required: bool, mp_keep: float | None = None) -> Simulator | None:
    missing = [str(p) for p in paths if not Path(p).is_file()]
    if missing:
        if required:
            raise UserError(f"cost models not found: {', '.join(missing)}; {_models_hint(N)}")
        return None
    return Simulator.load(*paths, num_devices=N, mp_keep=mp_keep)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa
    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def device_report(tl: TableList, plan: ShardingPlan, cluster: Cluster, cost: Cost | None) -> str:
    mem = plan.device_mem_gb(tl.task)
    per_dev = plan.per_device()
    crit = cost.critical_device if cost else None
    rows = []
    for r in range(cluster.num_devices):
        c = ([f"{cost.compute_ms[r]:.3f}", f"{cost.fw_ms[r]:.3f}", f"{cost.bw_ms[r]:.3f}",
              f"{cost.per_device_ms[r]:.3f}"] if cost else ["-"] * 4)
        rows.append([f"{r}{' *' if r == crit else ''}", f"{mem[r]:.4f} / {cluster.max_mem_gb:g}", str(len(per_dev[r])),
                     *c])
    return _table(["device", "memory (GB)", "shards", "compute (ms)", "fw comm (ms)", "bw comm (ms)", "total (ms)"],
                  rows)


def table_report(tl: TableList, plan: ShardingPlan) -> str:
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
    return _table(["table", "rows", "dim", "shards", "devices", "columns@device"], rows)


def shard_tables(cfg: ShardTablesConfig) -> dict:
    """Plan the user's tables with `cfg.alg`, print the plan, write it (and optionally measure it)."""
    cfg.check()
    alg, ndevices, max_mem, seed, search = cfg.alg, cfg.ndevices, cfg.max_mem, cfg.seed, cfg.search
    cluster = Cluster(ndevices, max_mem)
    if alg == "all" or expand_algs([alg]) != [alg]:
        raise UserError(f"--alg takes one algorithm here, got {alg!r}")
    if cfg.measure:
        cluster.need_peers()
    out, torchrec_plan = cfg.out, cfg.torchrec_plan
    check_output_file(out, "--out")
    check_output_file(torchrec_plan, "--torchrec_plan")
    if cfg.tables is not None:
        tl = load_table_list(cfg.tables, max_mem)
    else:
        tl = tables_from_ids(cfg.ids, list(cfg.dims), max_mem)
    paths = cfg.models.paths(ndevices, cfg.mp_keep)
    sim = _simulator(paths, ndevices, required=alg == "neuroshard", mp_keep=cfg.mp_keep)
    batch = int(sim.compute.meta.get("batch_size") or 4096) if sim else 4096
    print(f"{len(tl.names)} tables from {tl.source}, {tl.task.total_size_gb():.4f} GB in all; "
          f"{ndevices} devices x {max_mem:g} GB; --alg {alg}")
    if tl.defaulted_reuse:
        print(f"note: {len(tl.defaulted_reuse)} table(s) had no reuse statistics (bin_0..bin_16): filled with the "
              f"published DLRM reuse histogram ({', '.join(tl.defaulted_reuse[:5])}"
              f"{', ...' if len(tl.defaulted_reuse) > 5 else ''})")
    res = shard_task(make_sharder(alg, seed, sim, search, batch), tl.task, cluster)
    if res.plan is None or res.oom:
        raise UserError(f"--alg {alg} found no plan within {ndevices} x {max_mem:g} GB for "
                        f"{tl.task.total_size_gb():.3f} GB of tables; raise --max_mem, add devices, or try --alg neuroshard")
    plan = res.plan
    cost = sim.plan_cost(tl.task, plan) if sim else None
    print(f"\nper device ({'predicted at batch ' + str(batch) + ' by the cost models' if sim else 'no cost models'}"
          f"; * = critical device), planned in {res.search_s:.2f} s")
    print(device_report(tl, plan, cluster, cost))
    print("\nper table\n" + table_report(tl, plan))
    spec = plan_spec(tl.names, tl.rows, tl.task.dims, plan)
    record = {"kind": PLAN_KIND, "alg": alg, "ndevices": ndevices, "max_mem_gb": max_mem, "splits": plan.splits,
              "tables": [{**t, "pooling_factor": float(tl.task.pooling_factors[i])} for i, t in enumerate(spec["tables"])],
              "predicted": None if cost is None else {
                  "batch_size": batch, "cost_ms": cost.cost_ms, "compute_ms": cost.compute_ms.tolist(),
                  "fw_ms": cost.fw_ms.tolist(), "bw_ms": cost.bw_ms.tolist()},
              "reuse_defaulted": tl.defaulted_reuse,
              "provenance": provenance(source=tl.source, models=[str(p) for p in paths] if sim else None,
                                       seed=seed, search=search.__dict__, mp_keep=cfg.mp_keep)}
    report = {"plan": plan, "tables": tl, "cost": cost, "spec": spec}
    if cfg.measure:
        report["measured"] = measure_user_plan(tl, plan, cluster, batch, cfg)
        record["measured"] = {k: v.cost_ms for k, v in report["measured"].items()}
    atomic_write_text(out, json.dumps(record, indent=1, default=str))
    print(f"\nplan written to {out}")
    if torchrec_plan:
        to_torchrec_plan(spec)  # TorchRec must accept it before the file is written
        write_torchrec_plan(torchrec_plan, spec, alg=alg, source=tl.source)
        print(f"TorchRec plan written to {torchrec_plan} (load it with "
              "neuroshard.sharding.torchrec_export.load_torchrec_plan)")
    return report


def measure_user_plan(tl: TableList, plan: ShardingPlan, cluster: Cluster, batch: int,
                      cfg: ShardTablesConfig) -> dict[str, Cost]:
    """Measure `plan` and the greedy heuristics' plans on synthesised ids of the user's tables."""
    from ..data.dataset import process_raw
    from ..data.synthetic import synthesize_tables
    from ..data.tasks import ShardingTask
    from ..hardware.backends import resolve_hardware
    from ..hardware.evaluator import measure_plans, plan_device_tables

    if tl.task.total_size_gb() > MEASURE_LIMIT_GB:
        raise UserError(f"--measure allocates every table on this machine: {tl.task.total_size_gb():.2f} GB is more "
                        f"than {MEASURE_LIMIT_GB:g} GB; measure a scaled-down copy of the table list")
    if batch % cluster.num_devices:
        raise UserError(f"the cost models' batch {batch} is not divisible by {cluster.num_devices} devices")
    alg, seed, warmup, iters = cfg.alg, cfg.seed, cfg.warmup_iter, cfg.num_iter
    gpu_ids = list(cfg.hardware.gpu_devices) if cfg.hardware.gpu_devices else None
    hw = resolve_hardware(cfg.hardware.device, cfg.hardware.backend, gpu_ids)
    plans = {alg: plan}
    for h in HEURISTICS:
        r = shard_task(make_sharder(h, seed), tl.task, cluster)
        if r.plan is not None and not r.oom:
            plans[h] = r.plan
    hists = tl.task.data_features[:, 2:]
    print(f"\nmeasuring {len(plans)} plans on synthesised ids (batch {batch}, {hw.backend}/{hw.device}, interleaved "
          f"in 5 rounds of {warmup} warm-up + {max(1, iters // 5)} timed iterations; cost = median round)")
    with tempfile.TemporaryDirectory(prefix="neuroshard-measure-") as tmp:
        raw = synthesize_tables(tl.rows, tl.task.pooling_factors, hists, batch, seed)
        ds = process_raw(*raw, out_dir=Path(tmp) / "ds", source={"source": "table list", "tables": tl.source})
        task = ShardingTask.from_dataset(ds, np.arange(len(tl.names)), tl.task.dims)
        measured = measure_plans(ds, hw, batch, {a: plan_device_tables(task, p) for a, p in plans.items()},
                                 cluster.num_devices, warmup, iters, rounds=5, group_of=lambda key: 0,
                                 mp_keep=cfg.mp_keep)
    best_h = min((a for a in measured if a != alg), key=lambda a: measured[a].cost_ms, default=None)
    for a, c in measured.items():
        mark = "" if best_h is None or a == best_h else (
            f"  ({100 * (c.cost_ms / measured[best_h].cost_ms - 1):+.1f}% vs best heuristic {best_h})" if a == alg else "")
        print(f"  {a:<20} measured {c.cost_ms:8.3f} ms{mark}")
    return measured
