"""Does step 6 need its warm-up iterations? The same plans measured with two warm-up counts, interleaved.

eval.py measures each plan in each of its rounds after `--warmup_iter` untimed iterations (the quick preset: 3, so
3 of every 8 iterations of step 6 are not timed). Each round builds the plan's tables afresh, and the last-level cache
is flushed before every timed iteration, so what a warm-up leaves warm is little. This benchmark takes the plans a
finished pipeline run measured (`--work_dir`: its test tasks and `results/eval_4.csv`), the first `--tasks` tasks'
plans of `--algs`, and measures them on the same engine (eval.py's settings) with each count of `--warmups`: in each
of `--rounds` rounds every count once, in alternating order, each a run of its own on the ranks.

It prints, for each count against the first, the per-plan ratio of the median costs (paired over plans, 95%), and
for each count the paired ratio of each algorithm's plans to the first algorithm's (paired over tasks): the figures
step 6 reports. A count that moves neither may replace the preset's.

With `--iters_per_round` each warm-up count has its own timed iterations a round (e.g. 3 warm-ups and 5 timed
against 1 and 3), and it prints each setting's seconds a round.

python benchmarks/eval_warmup.py --work_dir WORK [--tasks 8] [--algs neuroshard,size_lookup_greedy,torchrec]
    [--warmups 3,1] [--iters_per_round 5,3] [--rounds 5]
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from neuroshard.core.artifacts import check_output_file, write_results  # noqa: E402
from neuroshard.core.cli import config_from_args, run_main, step_parser  # noqa: E402
from neuroshard.core.config import PRESETS, flag  # noqa: E402
from neuroshard.core.errors import UserError, check_int  # noqa: E402
from neuroshard.core.file_names import RESULTS_DIR, eval_results_path  # noqa: E402
from neuroshard.core.intervals import paired_interval  # noqa: E402
from neuroshard.data.dataset import DLRMDataset  # noqa: E402
from neuroshard.hardware.backends import resolve_hardware  # noqa: E402
from neuroshard.hardware.engine import EngineSettings, measure_plans, plan_device_tables  # noqa: E402
from common import check_engine_flags, finished_run_plans  # noqa: E402

QUICK = PRESETS["quick"]


@dataclass
class EvalWarmupConfig:
    """Step 6's measured costs with two warm-up counts (benchmarks/eval_warmup.py)."""

    work_dir: str = flag("work", "a finished pipeline run (tools/run_pipeline.py --work_dir)")
    ndevices: int = flag(4)
    tasks: int = flag(8, "the first this many test tasks")
    algs: tuple[str, ...] = flag(("neuroshard", "size_lookup_greedy", "torchrec"),
                                 "algorithms whose plans are measured; ratios are against the first", parse="str_list")
    warmups: tuple[int, ...] = flag((QUICK.eval_warmup, 1), "warm-up counts compared; ratios are against the first",
                                    parse="int_list")
    num_iter: int = flag(QUICK.eval_iters, "timed iterations of each plan over all rounds (eval.py's)")
    iters_per_round: tuple[int, ...] = flag((), "timed iterations a round with each warm-up count, in --warmups' order "
                                                "(empty: --num_iter / --rounds for all)", parse="int_list")
    rounds: int = flag(QUICK.eval_rounds, "rounds; each measures every plan with every count")
    out_csv: str = flag("results/bench_eval_warmup.csv")

    def check(self) -> "EvalWarmupConfig":
        check_engine_flags(self)
        check_int("--tasks", self.tasks, 2, 1000)
        if len(self.warmups) < 2 or len(set(self.warmups)) < len(self.warmups):
            raise UserError("--warmups: give two or more different counts, e.g. --warmups 3,1")
        for w in self.warmups:
            check_int("--warmups", w, 0, 1000)
        if self.iters_per_round and len(self.iters_per_round) != len(self.warmups):
            raise UserError(f"--iters_per_round: give one count per --warmups value ({len(self.warmups)}), e.g. "
                            "--warmups 3,1 --iters_per_round 5,3")
        for k in self.iters_per_round:
            check_int("--iters_per_round", k, 1, 10_000)
        if len(self.algs) < 1:
            raise UserError("--algs: name one or more algorithms of the run's results")
        check_output_file(self.out_csv, "--out_csv")
        return self


def run_plans(work: Path, ndevices: int, algs, count: int) -> tuple[dict, DLRMDataset]:
    """{(task, alg): engine item} of the run's measured plans of `algs` for its first `count` test tasks."""
    ds, tasks, plans = finished_run_plans(work, ndevices)
    items = {(t, alg): plan_device_tables(tasks[t], plan) for t, alg, plan, _ in plans if alg in algs and t < count}
    missing = [a for a in algs if not any(k[1] == a for k in items)]
    if missing:
        raise UserError(f"{eval_results_path(work / RESULTS_DIR, ndevices)} has no plan of {', '.join(missing)} in its "
                        f"first {count} tasks; name others in --algs")
    return items, ds


def main(argv=None) -> None:
    C = EvalWarmupConfig
    a = config_from_args(C, step_parser(C, __doc__, raw_doc=True).parse_args(argv)).check()
    items, ds = run_plans(Path(a.work_dir), a.ndevices, a.algs, a.tasks)
    batch = ds.check_batch(None)
    hw = resolve_hardware("cpu", "auto")
    iters = dict(zip(a.warmups, a.iters_per_round or [max(1, a.num_iter // a.rounds)] * len(a.warmups)))
    costs: dict[tuple, list[float]] = {}
    seconds = {w: 0.0 for w in a.warmups}
    with tqdm(total=a.rounds * len(a.warmups) * len(items), desc="plans") as bar:
        for r in range(a.rounds):
            for w in (a.warmups if r % 2 == 0 else a.warmups[::-1]):
                settings = EngineSettings(str(ds.path), hw, batch, w, iters[w], shuffle=False)
                t0 = time.perf_counter()
                got = measure_plans(settings, items, a.ndevices, 1, on_result=lambda *_: bar.update(),
                                    group_of=lambda key: key[0])
                seconds[w] += time.perf_counter() - t0
                for key, m in got.items():
                    costs.setdefault((*key, w), []).append(m.cost_ms)
    rows = [{"task": t, "alg": alg, "warmup": w, "round": i, "cost_ms": c}
            for (t, alg, w), cs in costs.items() for i, c in enumerate(cs)]
    write_results(a.out_csv, rows, **asdict(a))
    report(costs, sorted({k[0] for k in items}), a.algs, a.warmups)
    print("seconds a round: " + ", ".join(f"warm-up {w} x {iters[w]} timed {seconds[w] / a.rounds:.1f} s"
                                          for w in a.warmups))


def report(costs: dict, tasks: list[int], algs, warmups) -> None:
    med = {k: float(np.median(v)) for k, v in costs.items()}
    first = warmups[0]
    plans = [(t, alg) for t in tasks for alg in algs if (t, alg, first) in med]
    for w in warmups[1:]:
        st = paired_interval(np.array([med[(*p, w)] for p in plans]), np.array([med[(*p, first)] for p in plans]))
        print(f"warm-up {w} / warm-up {first}, each plan's median cost ({len(plans)} plans): {st.estimate:.3f} "
              f"[{st.lo:.3f}, {st.hi:.3f}]")
    for alg in algs[1:]:
        both = [t for t in tasks if (t, alg, first) in med and (t, algs[0], first) in med]
        if len(both) < 2:
            continue
        for w in warmups:
            st = paired_interval(np.array([med[(t, algs[0], w)] for t in both]),
                                 np.array([med[(t, alg, w)] for t in both]))
            print(f"warm-up {w}: {algs[0]} / {alg} ({len(both)} tasks) {st.estimate:.3f} [{st.lo:.3f}, {st.hi:.3f}]")


if __name__ == "__main__":
    run_main(main)
