"""Where does step 6's compute time go? Each part of one compute measurement, timed on a finished run's plans.

eval.py measures a plan's compute on each rank with `ComputeBenchmark.measure`: build the fused operator, gather the
shard's inputs, run `--warmup` untimed and `--iters` timed iterations, flushing the last-level cache before each timed
one. This probe takes the device shards of the first `--plans` measured plans of a finished pipeline run
(`--work_dir`: its test tasks and `results/eval_4.csv`) and times each of those parts in one process, one thread (the
collectives are not timed here). It prints each part's mean ms per device shard and its share.

python benchmarks/step6_time.py --work_dir WORK [--plans 12]
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from neuroshard.core.cli import config_from_args, run_main, step_parser  # noqa: E402
from neuroshard.core.config import PRESETS, flag  # noqa: E402
from neuroshard.core.errors import UserError, check_int  # noqa: E402
from common import finished_run_plans  # noqa: E402

QUICK = PRESETS["quick"]


@dataclass
class Step6TimeConfig:
    """The parts of step 6's compute measurement (benchmarks/step6_time.py)."""

    work_dir: str = flag("work", "a finished pipeline run (tools/run_pipeline.py --work_dir)")
    ndevices: int = flag(4)
    plans: int = flag(12, "the first this many measured plans of the run")
    warmup: int = flag(QUICK.eval_warmup, "untimed iterations per measurement (eval.py's)")
    iters: int = flag(QUICK.eval_iters // QUICK.eval_rounds, "timed iterations per measurement (eval.py's a round)")

    def check(self) -> "Step6TimeConfig":
        check_int("--ndevices", self.ndevices, 2, 64)
        check_int("--plans", self.plans, 1, 10_000)
        check_int("--warmup", self.warmup, 0, 1000)
        check_int("--iters", self.iters, 1, 1000)
        return self


def main(argv=None) -> None:
    import torch

    from neuroshard.hardware.backends import make_fused, resolve_hardware
    from neuroshard.hardware.compute_bench import ComputeBenchmark
    from neuroshard.hardware.timing import CacheFlusher

    C = Step6TimeConfig
    a = config_from_args(C, step_parser(C, __doc__, raw_doc=True).parse_args(argv)).check()
    ds, tasks, plans = finished_run_plans(Path(a.work_dir), a.ndevices)
    if not plans:
        raise UserError(f"{a.work_dir}'s step 6 measured no plan within memory: nothing to time")
    torch.set_num_threads(1)
    hw = resolve_hardware("cpu", "auto")
    bench, flush = ComputeBenchmark(ds, hw, ds.check_batch(None)), CacheFlusher(hw.device)
    parts = {"build": 0.0, "inputs": 0.0, "iterations": 0.0, "flushes": 0.0}
    shards = 0
    for t, _, _, devices in plans[:a.plans]:
        task = tasks[t]
        for dev in devices:  # as step 6 built them
            if not dev:
                continue
            tables, dims = [int(task.table_ids[t]) for t, _, _ in dev], [int(d) for _, _, d in dev]
            t0 = time.perf_counter()
            op = make_fused([(int(ds.rows[t]), d) for t, d in zip(tables, dims)], hw)
            t1 = time.perf_counter()
            prepared, grad = op.prepare(*bench.inputs(tables)), torch.ones(bench.batch_size, sum(dims))
            t2 = time.perf_counter()
            for _ in range(a.warmup + a.iters):
                op.train_step(prepared, grad)
            t3 = time.perf_counter()
            for _ in range(a.iters):
                flush()
            t4 = time.perf_counter()
            for key, dt in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                parts[key] += dt
            shards += 1
    total = sum(parts.values())
    print(f"{shards} device shards of {min(a.plans, len(plans))} plans ({a.warmup} warm-ups, {a.iters} timed "
          f"iterations): " + ", ".join(f"{k} {v / shards * 1e3:.1f} ms ({v / total:.0%})" for k, v in parts.items()))


if __name__ == "__main__":
    run_main(main)
