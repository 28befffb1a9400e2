"""Why NeuroShard's plans measure dearer than its cost models predict: selection or bias? (issue 63's diagnosis)

On a finished pipeline run (`--work_dir`: its dataset, test tasks and cost models), per task:
- `selected`: NeuroShard's plan, chosen from thousands of candidates for the lowest simulated cost;
- `neighbours`: `--neighbours` plans made from it by moving `--moves` random shards each to another device
  (within memory). They sit in the same well-balanced region of plans, but no search chose them for a low
  prediction;
- `greedy`: size_lookup_greedy's plan, the control the models were never asked to rank.
Each task's plans are measured interleaved in `--rounds` rounds on the engine eval.py uses (the paper cost's
emulated devices), and each plan's simulated / measured cost is recorded.

Reading it: if the selected plan's simulated / measured ratio is lower than its neighbours' (paired over tasks,
95% interval), the search's choice itself finds where the models err low (the winner's curse). If the
neighbours' ratio is as low as the selected plan's, the models are biased low on balanced plans whatever picks
them. The paired ratio of the two ratios splits the selected plan's optimism into the two parts.

python benchmarks/winners_curse.py --work_dir WORK [--ndevices 4] [--neighbours 4] [--moves 2] [--rounds 5]
"""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from neuroshard.core.artifacts import check_output_file, write_results  # noqa: E402
from neuroshard.core.cli import config_from_args, run_main, step_parser  # noqa: E402
from neuroshard.core.config import PRESETS, SearchParams, flag  # noqa: E402
from neuroshard.core.costs import Cluster  # noqa: E402
from neuroshard.core.errors import check_int  # noqa: E402
from common import check_engine_flags  # noqa: E402
from neuroshard.core.file_names import DATASET_DIR, MODELS_DIR, TASKS_DIR, tasks_path  # noqa: E402
from neuroshard.core.intervals import paired_interval  # noqa: E402
from neuroshard.data.dataset import DLRMDataset  # noqa: E402
from neuroshard.data.tasks import load_tasks  # noqa: E402
from neuroshard.hardware.backends import resolve_hardware  # noqa: E402
from neuroshard.hardware.engine import EngineSettings, measure_plans, plan_device_tables  # noqa: E402
from neuroshard.sharding.plan import Placement, fits_memory  # noqa: E402
from neuroshard.sharding.registry import make_sharder, shard_task  # noqa: E402
from neuroshard.sharding.simulator import Simulator  # noqa: E402


@dataclass
class WinnersCurseConfig:
    """Selection or bias behind NeuroShard's optimism (benchmarks/winners_curse.py)."""

    work_dir: str = flag("work", "a finished pipeline run (tools/run_pipeline.py --work_dir)")
    ndevices: int = flag(4)
    max_mem: float = flag(PRESETS["quick"].max_mem, "memory of one device, GB (the quick preset's)")
    warmup_iter: int = flag(PRESETS["quick"].eval_warmup, "warm-up iterations of each plan in each round")
    num_iter: int = flag(PRESETS["quick"].eval_iters, "timed iterations of each plan over all rounds")
    neighbours: int = flag(4, "plans made from each selected plan by random moves")
    moves: int = flag(2, "shards each neighbour moves to another device")
    rounds: int = flag(5, "interleaved rounds of each task's plans")
    seed: int = flag(0)
    out_csv: str = flag("results/bench_winners_curse.csv")

    def check(self) -> "WinnersCurseConfig":
        check_engine_flags(self)
        check_int("--neighbours", self.neighbours, 1, 100)
        check_int("--moves", self.moves, 1, 1000)
        check_output_file(self.out_csv, "--out_csv")
        return self


def neighbours(plan: Placement, task, cluster: Cluster, count: int, moves: int, rng) -> list[Placement]:
    """`count` distinct plans, each `plan` with `moves` random shards moved to another random device, within
    memory (fewer where few such plans exist)."""
    out, seen = [], {tuple(plan.device_of)}
    for _ in range(200 * count):
        if len(out) == count:
            break
        dev = list(plan.device_of)
        for s in rng.choice(len(dev), size=min(moves, len(dev)), replace=False):
            dev[s] = int(rng.choice([d for d in range(plan.num_devices) if d != dev[s]]))
        cand = Placement(plan.num_devices, plan.shards, dev, plan.splits)
        if tuple(dev) not in seen and fits_memory(task, cand, cluster):
            seen.add(tuple(dev))
            out.append(cand)
    return out


def main(argv=None) -> None:
    C = WinnersCurseConfig
    a = config_from_args(C, step_parser(C, __doc__, raw_doc=True).parse_args(argv)).check()
    work = Path(a.work_dir)
    ds = DLRMDataset.load(work / DATASET_DIR)
    tasks = load_tasks(tasks_path(work / TASKS_DIR, "test"), ds)
    sim = Simulator.from_files(work / MODELS_DIR, a.ndevices)  # the paper cost, as eval_simulator.py scores
    batch = ds.check_batch(None)
    cluster = Cluster(a.ndevices, a.max_mem).need_peers()
    rng = np.random.default_rng(a.seed)
    plans, info, left_out = {}, {}, 0
    for t, task in enumerate(tqdm(tasks, desc="planning")):
        found = {}
        for alg, kind in (("neuroshard", "selected"), ("size_lookup_greedy", "greedy")):
            res = shard_task(make_sharder(alg, a.seed, sim, SearchParams(), batch), task, cluster)
            if not res.oom:
                found[kind] = res.plan
        if "selected" not in found:
            continue
        for i, p in enumerate(neighbours(found["selected"], task, cluster, a.neighbours, a.moves, rng)):
            found[f"neighbour{i}"] = p
        costs = {kind: sim.plan_cost(task, p) for kind, p in found.items()}
        bad = {kind for kind, c in costs.items() if c.implausible()}
        left_out += len(bad) if "selected" not in bad else len(found)
        if "selected" in bad:  # nothing to pair with
            continue
        for kind, p in found.items():
            if kind not in bad:
                plans[(t, kind)] = plan_device_tables(task, p)
                info[(t, kind)] = costs[kind].cost_ms
    hw = resolve_hardware("cpu", "auto")
    settings = EngineSettings(str(ds.path), hw, batch, a.warmup_iter, max(1, a.num_iter // a.rounds),
                              shuffle=True)
    with tqdm(total=len(plans), desc="measuring") as bar:
        measured = measure_plans(settings, plans, a.ndevices, a.rounds, on_result=lambda *_: bar.update(),
                                 group_of=lambda key: key[0])
    rows = [{"task": t, "plan": kind, "simulated_ms": info[(t, kind)], "measured_ms": measured[(t, kind)].cost_ms,
             "sim_over_meas": info[(t, kind)] / measured[(t, kind)].cost_ms} for (t, kind) in plans]
    write_results(a.out_csv, rows, **asdict(a))
    if left_out:
        print(f"note: {left_out} plans left out, their simulated cost one that cannot be true (a model extrapolating "
              "below 0); a task whose selected plan is one of them is left out whole")
    report(rows)


def report(rows: list[dict]) -> None:
    """The medians of simulated / measured per kind of plan, and the paired comparisons over tasks."""
    by_task: dict[int, dict] = {}
    for r in rows:
        kind = "neighbours" if r["plan"].startswith("neighbour") else r["plan"]
        by_task.setdefault(r["task"], {}).setdefault(kind, []).append(r["sim_over_meas"])
    kinds = ("selected", "neighbours", "greedy")
    per_kind = {k: np.array([np.exp(np.mean(np.log(v[k]))) for v in by_task.values() if k in v]) for k in kinds}
    for k in kinds:
        if len(per_kind[k]):
            print(f"{k:<11} median simulated / measured {np.median(per_kind[k]):.3f} over {len(per_kind[k])} tasks")
    both = [v for v in by_task.values() if "selected" in v and "neighbours" in v]
    if len(both) < 2:
        print(f"{len(both)} task(s) with a selected plan and its neighbours: too few to pair")
        return
    sel = np.array([np.exp(np.mean(np.log(v["selected"]))) for v in both])
    nb = np.array([np.exp(np.mean(np.log(v["neighbours"]))) for v in both])
    st = paired_interval(sel, nb)
    print(f"selected / neighbours (their simulated / measured ratios, paired over {len(both)} tasks): "
          f"{st.estimate:.3f} [{st.lo:.3f}, {st.hi:.3f}]: below 1, the search's choice finds where the models err low")
    cost = {}
    for r in rows:
        kind = "neighbours" if r["plan"].startswith("neighbour") else r["plan"]
        for what in ("simulated_ms", "measured_ms"):
            cost.setdefault((r["task"], kind, what), []).append(r[what])
    tasks = sorted({t for t, kind, _ in cost if kind == "selected" and (t, "neighbours", "measured_ms") in cost})
    for what, words in (("simulated_ms", "simulated"), ("measured_ms", "measured")):
        st = paired_interval(np.array([cost[(t, "selected", what)][0] for t in tasks]),
                             np.array([np.exp(np.mean(np.log(cost[(t, "neighbours", what)]))) for t in tasks]))
        print(f"selected plan's {words} cost / its neighbours' ({len(tasks)} tasks): {st.estimate:.3f} "
              f"[{st.lo:.3f}, {st.hi:.3f}]")
    grd = [v for v in both if "greedy" in v]
    if len(grd) >= 2:
        st = paired_interval(np.array([np.exp(np.mean(np.log(v["neighbours"]))) for v in grd]),
                             np.array([np.exp(np.mean(np.log(v["greedy"]))) for v in grd]))
        print(f"neighbours / greedy ({len(grd)} tasks): {st.estimate:.3f} [{st.lo:.3f}, {st.hi:.3f}]: below 1, the "
              "models are biased low on balanced plans that no search chose")


if __name__ == "__main__":
    run_main(main)
