"""Does ranking plans by the ensemble's mean + lambda x spread pick plans that measure cheaper? (issue 63)

On a finished pipeline run with ensemble members (`--work_dir`: its dataset, tasks, cost models and
models/ensemble/), per task of `--split`: the plans of neuroshard (the paper's search), neuroshard_risk at each
`--lambdas` value, size_lookup_greedy (the best heuristic of the quick preset's runs) and, with `--torchrec`,
TorchRec's planner. Each task's distinct plans are measured interleaved in `--rounds` rounds on the engine eval.py
uses (the paper cost's emulated devices). Each plan gets its pre-trained models' cost, the members' mean and standard
deviation, and its measured cost.

Reading it:
- per lambda: its plans' measured cost / neuroshard's and / size_lookup_greedy's, paired over tasks (95% interval),
  and its plans' median predicted (members' mean) / measured. Choose lambda on the train split.
- the interval width: the multiple of the members' 90% interval (mean +- 1.645 sd) that covers 90% of the split's
  measured plans (`--width` states one; its coverage on the split is printed, so a width chosen on train is
  checked on test).

python benchmarks/risk_search.py --work_dir WORK --split train --lambdas 0,1,2
python benchmarks/risk_search.py --work_dir WORK --split test --lambdas 1 --torchrec --width W
"""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from neuroshard.core.artifacts import check_output_file, write_results  # noqa: E402
from neuroshard.core.cli import config_from_args, run_main, step_parser  # noqa: E402
from neuroshard.core.config import PRESETS, SearchParams, flag  # noqa: E402
from neuroshard.core.costs import Cluster  # noqa: E402
from neuroshard.core.errors import UserError, check_float, check_int  # noqa: E402
from neuroshard.core.file_names import DATASET_DIR, MODELS_DIR, TASKS_DIR, tasks_path  # noqa: E402
from neuroshard.core.intervals import paired_interval  # noqa: E402
from neuroshard.data.dataset import DLRMDataset  # noqa: E402
from neuroshard.data.tasks import load_tasks  # noqa: E402
from neuroshard.hardware.backends import resolve_hardware  # noqa: E402
from neuroshard.hardware.engine import EngineSettings  # noqa: E402
from neuroshard.sharding.registry import make_sharder, shard_task  # noqa: E402
from neuroshard.sharding.risk import check_members, plan_spread  # noqa: E402
from neuroshard.sharding.simulator import Simulator  # noqa: E402
from common import check_engine_flags, measure_task_plans  # noqa: E402

Z90 = 1.6448536269514722


@dataclass
class RiskSearchConfig:
    """Measured worth of the risk-aware search (benchmarks/risk_search.py)."""

    work_dir: str = flag("work", "a finished pipeline run with ensemble members (tools/run_pipeline.py --work_dir)")
    split: str = flag("train", "the tasks: train (choose lambda and the width) or test (check them)",
                      choices=("train", "test"))
    lambdas: tuple[float, ...] = flag((0.0, 1.0, 2.0), "risk_lambda values of neuroshard_risk", parse="float_list")
    torchrec: bool = flag(False, "also TorchRec's planner")
    width: float = flag(1.0, "the stated interval: mean +- 1.645 x sd x this")
    ndevices: int = flag(4)
    max_mem: float = flag(PRESETS["quick"].max_mem, "memory of one device, GB (the quick preset's)")
    warmup_iter: int = flag(PRESETS["quick"].eval_warmup, "warm-up iterations of each plan in each round")
    num_iter: int = flag(PRESETS["quick"].eval_iters, "timed iterations of each plan over all rounds")
    rounds: int = flag(PRESETS["quick"].eval_rounds, "interleaved rounds of each task's plans")
    max_tasks: int | None = flag(None, "the first N tasks of the split (default all)")
    out_csv: str = flag("results/bench_risk_search.csv")

    def check(self) -> "RiskSearchConfig":
        check_engine_flags(self)
        if self.max_tasks is not None:
            check_int("--max_tasks", self.max_tasks, 2)
        if not self.lambdas:
            raise UserError("--lambdas is empty; give at least one value, e.g. --lambdas 1")
        for v in self.lambdas:
            check_float("--lambdas", v, 0.0, 10.0)
        check_float("--width", self.width, 0.0, 100.0, lo_open=True)
        check_output_file(self.out_csv, "--out_csv")
        return self


def risk_alg(lam: float) -> str:
    return f"neuroshard_risk@{lam:g}"


def main(argv=None) -> None:
    C = RiskSearchConfig
    a = config_from_args(C, step_parser(C, __doc__, raw_doc=True).parse_args(argv)).check()
    work = Path(a.work_dir)
    ds = DLRMDataset.load(work / DATASET_DIR)
    tasks = load_tasks(tasks_path(work / TASKS_DIR, a.split), ds)[:a.max_tasks]
    sim = Simulator.from_files(work / MODELS_DIR, a.ndevices)  # the paper cost, as eval_simulator.py scores
    check_members(sim, "benchmarks/risk_search.py")
    batch = ds.check_batch(None)
    cluster = Cluster(a.ndevices, a.max_mem).need_peers()
    algs = {"neuroshard": ("neuroshard", SearchParams()), "size_lookup_greedy": ("size_lookup_greedy", None),
            **{risk_alg(v): ("neuroshard_risk", replace(SearchParams(), risk_lambda=v)) for v in a.lambdas},
            **({"torchrec": ("torchrec", None)} if a.torchrec else {})}

    def plans_of(task):
        res = {name: shard_task(make_sharder(alg, 0, sim, params, batch), task, cluster)
               for name, (alg, params) in algs.items()}
        return {} if any(r.oom for r in res.values()) else {name: r.plan for name, r in res.items()}  # {}: unpaired

    hw = resolve_hardware("cpu", "auto")
    settings = EngineSettings(str(ds.path), hw, batch, a.warmup_iter, max(1, a.num_iter // a.rounds), shuffle=True)
    rows = []
    for (t, name), (plan, m) in measure_task_plans(settings, tasks, plans_of, a.ndevices, a.rounds, a.split).items():
        sp = plan_spread(sim, tasks[t], plan)
        rows.append({"split": a.split, "task": t, "alg": name, "simulated_ms": sim.plan_cost(tasks[t], plan).cost_ms,
                     "members_mean_ms": sp.mean_ms, "members_sd_ms": sp.sd_ms, "measured_ms": m.cost_ms})
    write_results(a.out_csv, rows, **asdict(a))
    report(rows, a.width)


def report(rows: list[dict], width: float) -> None:
    """Per algorithm: paired measured ratios against neuroshard and size_lookup_greedy, fidelity, coverage."""
    by = {(r["task"], r["alg"]): r for r in rows}
    tasks = sorted({r["task"] for r in rows})
    names = list(dict.fromkeys(r["alg"] for r in rows))
    print(f"{len(tasks)} tasks; paired measured cost ratios (95% interval), median predicted / measured")
    for name in names:
        line = f"{name:<22}"
        for base in ("neuroshard", "size_lookup_greedy", "torchrec"):
            if base == name or (tasks[0], base) not in by:
                continue
            st = paired_interval([by[(t, name)]["measured_ms"] for t in tasks],
                                 [by[(t, base)]["measured_ms"] for t in tasks])
            line += f"  / {base} {st.estimate:.3f} [{st.lo:.3f}, {st.hi:.3f}]"
        r = [by[(t, name)] for t in tasks]
        sim = np.median([x["simulated_ms"] / x["measured_ms"] for x in r])
        mean = np.median([x["members_mean_ms"] / x["measured_ms"] for x in r])
        print(f"{line}  sim/meas {sim:.3f}  members' mean/meas {mean:.3f}")
    m, sd, s, y = (np.array([r[k] for r in rows]) for k in ("members_mean_ms", "members_sd_ms", "simulated_ms",
                                                             "measured_ms"))
    for what, centre, half in (("members' mean +- 1.645 sd", m, sd), ("the models' cost x (1 +- 1.645 sd / mean)",
                                                                      s, s * sd / m)):
        z = np.abs(y - centre) / np.maximum(half, 1e-9) / Z90
        print(f"{what}, x {width:g}: covers {np.mean(z <= width):.1%} of {len(rows)} plans; x "
              f"{np.quantile(z, 0.9):.2f} would cover 90%")


if __name__ == "__main__":
    run_main(main)
