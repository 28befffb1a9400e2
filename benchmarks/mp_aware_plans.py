"""Does planning for DCT-MP's compressed all-to-all pay? (issue 16; by hand, not in CI.)

python benchmarks/mp_aware_plans.py [--mp_keep 0.05] [--ndevices 4] [--max_mem 0.04]

Needs the quick pipeline's data/ and models/ (compute.pt, comm_<N>_fw/bw.pt) plus comm models for the
compressed all-to-all:
    python collect_comm_cost_data.py --ndevices 4 --T_range 10,30 --mp_keep 0.05
    python train_comm_cost_model.py --ndevices 4 --mp_keep 0.05 --epochs 500
Every test task is sharded twice by NeuroShard with the same compute model and search: once with
the comm models of the uncompressed all-to-all ("dense-comm plan"), once with those of the
compressed one ("mp-aware plan"). Where the two plans differ, both are measured in ONE interleaved
run with compression on (eval.py --mp_keep's measurement: each task's two plans alternate for
--rounds rounds, cost = geometric mean over rounds, hardware/engine.py); identical plans count as ratio 1.
Printed: the paired geometric-mean ratio mp-aware / dense-comm with its bootstrap 95% interval
(core/intervals.py), wins/ties/losses, and how the plans differ (splits, spread of dim sums and of measured compute).
Writes --out (JSON) with every task's numbers.
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from neuroshard.core.artifacts import provenance, write_json  # noqa: E402
from neuroshard.core.cli import config_from_args, run_main, step_parser  # noqa: E402
from neuroshard.core.config import PRESETS, CostModelFiles, SearchParams, check_iters, check_mp_keep, flag  # noqa: E402
from neuroshard.core.errors import UserError, check_int  # noqa: E402
from neuroshard.core.file_names import DATASET_DIR, TASKS_DIR, tasks_path  # noqa: E402
from neuroshard.core.tables import format_table  # noqa: E402
from neuroshard.core.costs import Cluster, check_max_mem_gb  # noqa: E402
from neuroshard.data.dataset import DLRMDataset  # noqa: E402
from neuroshard.data.tasks import load_tasks  # noqa: E402
from neuroshard.experiments.paired import paired  # noqa: E402
from neuroshard.hardware.backends import resolve_hardware  # noqa: E402
from neuroshard.hardware.engine import EngineSettings, measure_plans, plan_device_tables  # noqa: E402
from neuroshard.sharding.registry import make_sharder, shard_task  # noqa: E402
from neuroshard.sharding.simulator import Simulator  # noqa: E402

PLANS = ("dense-comm", "mp-aware")
QUICK = PRESETS["quick"]


def imbalance(x) -> float:
    """max / mean of per-device values (1 = perfectly balanced)."""
    x = np.asarray(x, np.float64)
    return float(x.max() / x.mean()) if x.mean() > 0 else 1.0


@dataclass
class MpAwarePlansConfig:
    """Does planning for DCT-MP's compressed all-to-all pay? (benchmarks/mp_aware_plans.py)"""

    mp_keep: float = flag(0.05, "DCT-MP's share of pooled entries sent (0 < K < 1)")
    ndevices: int = flag(4)
    max_mem: float = flag(QUICK.max_mem, "GB per device (quick preset)")
    data_dir: str = flag(DATASET_DIR)
    task_path: str = flag(str(tasks_path(TASKS_DIR, "test")))
    warmup_iter: int = flag(QUICK.eval_warmup, "(the quick preset's eval.py settings)")
    num_iter: int = flag(QUICK.eval_iters, "timed iterations of a plan, over all rounds")
    rounds: int = flag(QUICK.eval_rounds)
    order: str = flag("alternate", "which plan goes first in each round: alternate by task (default) or always the "
                                   "same", choices=("alternate", "dense-first", "mp-first"))
    out: str = flag("results/mp_aware_plans.json")

    def check(self) -> "MpAwarePlansConfig":
        if check_mp_keep(self.mp_keep) is None:
            raise UserError("--mp_keep 1 is the uncompressed all-to-all: nothing to compare")
        check_int("--ndevices", self.ndevices, 2, 1024)
        check_max_mem_gb(self.max_mem)
        check_iters(self.warmup_iter, self.num_iter)
        check_int("--rounds", self.rounds, 1, 1000)
        return self


def main(argv=None) -> None:
    C = MpAwarePlansConfig
    a = config_from_args(C, step_parser(C, __doc__, raw_doc=True).parse_args(argv)).check()
    mp, N = check_mp_keep(a.mp_keep), a.ndevices
    ds = DLRMDataset.load(a.data_dir)
    batch = ds.check_batch(None)
    tasks = load_tasks(a.task_path, ds)
    cluster = Cluster(N, a.max_mem)
    files = CostModelFiles()
    sims = {"dense-comm": Simulator.from_files(files, N), "mp-aware": Simulator.from_files(files, N, mp)}
    for s in sims.values():
        s.check_dataset(ds.fingerprint, batch)
    plans, todo, rows = {}, {}, []
    for t, task in enumerate(tasks):
        res = {k: shard_task(make_sharder("neuroshard", 0, sim, SearchParams(), batch), task, cluster)
               for k, sim in sims.items()}
        if any(r.plan is None or r.oom for r in res.values()):
            continue
        plans[t] = {k: r.plan for k, r in res.items()}
        same = all(json.dumps(res[k].plan.to_dict()) == json.dumps(res[PLANS[0]].plan.to_dict()) for k in PLANS)
        first = {"dense-first": PLANS[0], "mp-first": PLANS[1]}.get(a.order, PLANS[t % 2])
        rows.append({"task": t, "identical": same, "measured first": first,
                     **{f"{k} splits": len(plans[t][k].splits) for k in PLANS},
                     **{f"{k} dim-sum imbalance": imbalance(plans[t][k].device_dim_sums()) for k in PLANS},
                     **{f"{k} predicted ms": sims["mp-aware"].plan_cost(task, plans[t][k]).cost_ms for k in PLANS}})
        if not same:
            for k in (PLANS if first == PLANS[0] else PLANS[::-1]):  # the order within each round
                todo[(k, t)] = plan_device_tables(task, plans[t][k])
    hw = resolve_hardware("auto", "auto", None)
    print(f"{len(rows)} tasks with two valid plans, {sum(not r['identical'] for r in rows)} differ; measuring those "
          f"on {N} ranks ({hw.backend}/{hw.device}, batch {batch}) with the compressed all-to-all (mp_keep {mp:g}), "
          f"interleaved in {a.rounds} rounds", flush=True)
    bar = tqdm(total=len(todo), desc="plans measured")
    engine = EngineSettings(str(ds.path), hw, batch, a.warmup_iter, max(1, a.num_iter // a.rounds), mp, shuffle=False)
    measured = measure_plans(engine, todo, N, a.rounds, group_of=lambda key: key[1],
                             on_result=lambda *_: bar.update()) if todo else {}
    bar.close()
    costs = {k: {} for k in PLANS}
    for r in rows:
        t = r["task"]
        for k in PLANS:
            m = measured.get((k, t))
            if m is not None:
                r.update({f"{k} measured ms": m.cost_ms, f"{k} compute imbalance": imbalance(m.compute_ms),
                          f"{k} compute ms": m.compute_ms.tolist(), f"{k} comm ms": (m.fw_ms + m.bw_ms).tolist()})
        if r["identical"]:
            costs["mp-aware"][t] = costs["dense-comm"][t] = 1.0  # the same plan: ratio 1
        elif all((k, t) in measured for k in PLANS):
            for k in PLANS:
                costs[k][t] = r[f"{k} measured ms"]
    stats_all = paired(costs["mp-aware"], costs["dense-comm"])
    differ = [r["task"] for r in rows if not r["identical"]]
    stats_diff = paired({t: costs["mp-aware"][t] for t in differ if t in costs["mp-aware"]},
                        {t: costs["dense-comm"][t] for t in differ if t in costs["dense-comm"]})
    by_order = {f: paired({r["task"]: costs["mp-aware"][r["task"]] for r in rows if r["measured first"] == f
                           and r["task"] in costs["mp-aware"]},
                          {r["task"]: costs["dense-comm"][r["task"]] for r in rows if r["measured first"] == f
                           and r["task"] in costs["dense-comm"]}) for f in PLANS}
    pred = paired({r["task"]: r["mp-aware predicted ms"] for r in rows},
                  {r["task"]: r["dense-comm predicted ms"] for r in rows})
    lines = format_table(["mp-aware vs dense-comm plan (both measured compressed)", "tasks", "geo-mean ratio",
                          "95% CI", "wins / ties / losses"],
                         [[name, s["n"], f"{s['ratio']:.3f}", f"[{s['ci_lo']:.3f}, {s['ci_hi']:.3f}]",
                           f"{s['wins']} / {s['ties']} / {s['losses']}"]
                          for name, s in (("all tasks (identical plans = 1)", stats_all),
                                          ("tasks whose plans differ", stats_diff),
                                          ("... dense-comm plan measured first in each round", by_order["dense-comm"]),
                                          ("... mp-aware plan measured first in each round", by_order["mp-aware"]),
                                          ("predicted by the mp models, all tasks", pred))], align="lrrrr")
    cells = []
    for k in PLANS:
        ci = [r[f"{k} compute imbalance"] for r in rows if f"{k} compute imbalance" in r]
        cells.append([k, f"{np.mean([r[f'{k} splits'] for r in rows]):.2f}",
                      f"{np.mean([r[f'{k} dim-sum imbalance'] for r in rows]):.3f}",
                      f"{np.mean(ci) if ci else float('nan'):.3f}"])
    lines += ["", *format_table(["plan", "mean splits", "mean dim-sum imbalance (max/mean)",
                                 "mean measured compute imbalance (tasks that differ)"], cells, align="lrrr")]
    print("\n".join(lines))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, {"mp_keep": mp, "ndevices": N, "max_mem_gb": a.max_mem, "batch_size": batch,
                     "hardware": hw.describe(), "paired_all": stats_all, "paired_differ": stats_diff,
                     "paired_predicted": pred, "paired_by_first": by_order, "tasks": rows, "table": lines,
                     "provenance": provenance(args=asdict(a))})
    print(f"wrote {out}")


if __name__ == "__main__":
    run_main(main)
