"""Do comm models that also learn from the engine's own all-to-alls take the search's optimism away? (issue 63)

The comm cost data are all-to-alls of random layouts, with ranks that sleep before them. The search ends in plans of
even dim sums, whose ranks all compute, then all exchange together; on shared cores such plans measured dearer than
the comm models price them (docs/findings.md). This probe, on a finished pipeline run (`--work_dir`):
1. plans each training task with `--train_algs` and measures the plans, interleaved in `--rounds` rounds, on the
   engine eval.py uses (the paper cost's emulated devices);
2. turns each measured plan into one comm sample per direction: per rank its dim sum, its wait (its measured compute
   + backward all-to-all less the earliest rank's) and its measured forward and backward all-to-all;
3. trains forward and backward comm models on the pipeline's comm data plus these samples (same trainer, epochs and
   seed as the pipeline's), the compute model unchanged;
4. plans each test task with NeuroShard's search on the pipeline's models (`neuroshard`) and on the retrained comm
   models (`neuroshard_engine_comm`), and size_lookup_greedy, and measures them interleaved.

It prints each plan kind's paired measured cost ratios (95% interval) and its median simulated / measured cost,
each search's plans simulated by its own models.

With `--extra_comm_data FILE` (a comm cost-data file of the same devices and batch, e.g. collected with another
`--sleep_range`), its samples are added instead of the engine's, and no training task is measured.

python benchmarks/engine_comm_data.py --work_dir WORK
python benchmarks/engine_comm_data.py --work_dir WORK --extra_comm_data WORK/extra/comm_cost_data_4.pkl
"""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from neuroshard.core.artifacts import check_output_file, write_results  # noqa: E402
from neuroshard.core.cli import config_from_args, run_main, step_parser  # noqa: E402
from neuroshard.core.config import PRESETS, SearchParams, flag  # noqa: E402
from neuroshard.core.costs import Cluster  # noqa: E402
from neuroshard.core.errors import UserError, check_int  # noqa: E402
from neuroshard.core.file_names import COST_DATA_DIR, DATASET_DIR, MODELS_DIR, TASKS_DIR, comm_data_path, tasks_path  # noqa: E402
from neuroshard.core.intervals import paired_interval  # noqa: E402
from neuroshard.data.dataset import DLRMDataset  # noqa: E402
from neuroshard.data.tasks import load_tasks  # noqa: E402
from neuroshard.hardware.backends import resolve_hardware  # noqa: E402
from neuroshard.hardware.collect import load_cost_data  # noqa: E402
from neuroshard.hardware.comm_bench import COMM_DATA_KIND  # noqa: E402
from neuroshard.hardware.engine import EngineSettings  # noqa: E402
from neuroshard.models.cost_models import CommCostModel, comm_training_arrays  # noqa: E402
from neuroshard.sharding.registry import expand_algs, make_sharder, shard_task  # noqa: E402
from neuroshard.sharding.simulator import Simulator  # noqa: E402
from common import check_engine_flags, measure_task_plans  # noqa: E402


@dataclass
class EngineCommConfig:
    """Comm models that also learn from the engine's all-to-alls (benchmarks/engine_comm_data.py)."""

    work_dir: str = flag("work", "a finished pipeline run (tools/run_pipeline.py --work_dir)")
    train_algs: tuple[str, ...] = flag(("neuroshard", "size_lookup_greedy", "dim_greedy", "torchrec"),
                                       "algorithms whose training-task plans are measured", parse="str_list")
    ndevices: int = flag(4)
    max_mem: float = flag(PRESETS["quick"].max_mem, "memory of one device, GB (the quick preset's)")
    warmup_iter: int = flag(PRESETS["quick"].eval_warmup, "warm-up iterations of each plan in each round")
    num_iter: int = flag(PRESETS["quick"].eval_iters, "timed iterations of each plan over all rounds")
    rounds: int = flag(PRESETS["quick"].eval_rounds, "interleaved rounds of each task's plans")
    epochs: int = flag(PRESETS["quick"].epochs, "comm models' training epochs (the quick preset's)")
    extra_comm_data: str | None = flag(None, "add this comm cost-data file's samples instead of the engine's")
    out_csv: str = flag("results/bench_engine_comm_data.csv")

    def check(self) -> "EngineCommConfig":
        check_engine_flags(self)
        check_int("--epochs", self.epochs, 1, 100_000)
        expand_algs(self.train_algs)
        check_output_file(self.out_csv, "--out_csv")
        return self


def engine_samples(measured) -> list[dict]:
    """One comm sample per measured plan: per rank dim sum, wait and both all-to-alls (module docstring)."""
    out = []
    for plan, m in measured.values():
        parts = np.asarray(m.parts_ms, np.float64)  # [N, (compute, fw, bw)]
        ready = parts[:, 0] + parts[:, 2]
        out.append({"dim_sums": plan.device_dim_sums().astype(np.float64), "delays_ms": ready - ready.min(),
                    "fw_ms": parts[:, 1], "bw_ms": parts[:, 2]})
    return out


def main(argv=None) -> None:
    C = EngineCommConfig
    a = config_from_args(C, step_parser(C, __doc__, raw_doc=True).parse_args(argv)).check()
    work = Path(a.work_dir)
    ds = DLRMDataset.load(work / DATASET_DIR)
    sim = Simulator.from_files(work / MODELS_DIR, a.ndevices)  # the paper cost, as eval_simulator.py scores
    batch = ds.check_batch(None)
    cluster = Cluster(a.ndevices, a.max_mem).need_peers()
    hw = resolve_hardware("cpu", "auto")
    settings = EngineSettings(str(ds.path), hw, batch, a.warmup_iter, max(1, a.num_iter // a.rounds), shuffle=True)

    def plans(sharders):
        def of(task):
            res = {k: shard_task(s, task, cluster) for k, s in sharders.items()}
            return {k: r.plan for k, r in res.items() if not r.oom}
        return of

    meta, old = load_cost_data(comm_data_path(work / COST_DATA_DIR, a.ndevices), COMM_DATA_KIND)
    if a.extra_comm_data:
        extra_meta, new = load_cost_data(a.extra_comm_data, COMM_DATA_KIND)
        if any(extra_meta.get(k) != meta.get(k) for k in ("ndevices", "batch_size", "mp_keep", "input_dist")):
            raise UserError(f"{a.extra_comm_data} holds other all-to-all samples than the run's comm cost data "
                            "(devices, batch, mp_keep or input distribution); collect them with "
                            "collect_comm_cost_data.py and the run's --ndevices and batch")
    else:
        train = measure_task_plans(settings, load_tasks(tasks_path(work / TASKS_DIR, "train"), ds),
                                   plans({alg: make_sharder(alg, 0, sim, SearchParams(), batch) for alg in a.train_algs}),
                                   a.ndevices, a.rounds, "train")
        new = engine_samples(train)
    models = []
    for direction, base in (("fw", sim.fw), ("bw", sim.bw)):
        x, y = comm_training_arrays(old + new, direction)
        m = CommCostModel(a.ndevices, direction, {**base.meta, "training_input_max": [float(v) for v in x.max(0)]})
        m.fit((x,), y, epochs=a.epochs, seed=0, progress=False)
        models.append(m)
    engine_sim = Simulator(sim.compute, *models)
    test_tasks = load_tasks(tasks_path(work / TASKS_DIR, "test"), ds)
    test = measure_task_plans(settings, test_tasks,
                   plans({"neuroshard": make_sharder("neuroshard", 0, sim, SearchParams(), batch),
                          "neuroshard_engine_comm": make_sharder("neuroshard", 0, engine_sim, SearchParams(), batch),
                          "size_lookup_greedy": make_sharder("size_lookup_greedy")}),
                   a.ndevices, a.rounds, "test")
    rows = []
    for (t, kind), (plan, m) in test.items():
        rows.append({"task": t, "plan": kind, "measured_ms": m.cost_ms,
                     "simulated_ms": sim.plan_cost(test_tasks[t], plan).cost_ms,
                     "engine_comm_simulated_ms": engine_sim.plan_cost(test_tasks[t], plan).cost_ms})
    write_results(a.out_csv, rows, train_samples=len(new), **asdict(a))
    report(rows, len(new), len(old))


def report(rows: list[dict], new: int, old: int) -> None:
    by = {(r["task"], r["plan"]): r for r in rows}
    kinds = ("neuroshard", "neuroshard_engine_comm", "size_lookup_greedy")
    tasks = sorted(t for t in {r["task"] for r in rows} if all((t, k) in by for k in kinds))
    print(f"comm models retrained on {old} collected + {new} added samples; {len(tasks)} test tasks")
    for ours, theirs in ((kinds[1], kinds[0]), (kinds[1], kinds[2]), (kinds[0], kinds[2])):
        st = paired_interval([by[(t, ours)]["measured_ms"] for t in tasks], [by[(t, theirs)]["measured_ms"] for t in tasks])
        print(f"{ours} / {theirs}: measured {st.estimate:.3f} [{st.lo:.3f}, {st.hi:.3f}]")
    for k in kinds:
        r = [by[(t, k)] for t in tasks]
        print(f"{k:<24} median simulated / measured: pipeline models {np.median([x['simulated_ms'] / x['measured_ms'] for x in r]):.3f}, "
              f"with the added comm samples {np.median([x['engine_comm_simulated_ms'] / x['measured_ms'] for x in r]):.3f}")


if __name__ == "__main__":
    run_main(main)
