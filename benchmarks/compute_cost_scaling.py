"""How one device's measured compute cost grows with pooling, dim and table count (a speed claim, so it lives here
and not in the tests). Run by hand:
python benchmarks/compute_cost_scaling.py [--reps 15] [--backend auto]

Thirteen 20,000-row tables with uniform ids: tables 0-11 at pooling factor 2, table 12 at 60. Three pairs of
shards, each measured interleaved (a, b, a, b, ...) so load bursts hit both; per pair the geometric-mean ratio
b / a with its paired 95% interval:
- pooling: table 0 at dim 64 against table 12 at dim 64 (30x the lookups);
- dim: table 12 at dim 4 against dim 128 (32x the columns);
- tables: table 0 at dim 32 against tables 0-11 at dim 32 (12x the tables).
"""
from __future__ import annotations

import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from neuroshard.core.artifacts import write_results  # noqa: E402
from neuroshard.core.cli import config_from_args, run_main, step_parser  # noqa: E402
from neuroshard.core.config import flag  # noqa: E402
from neuroshard.core.errors import check_int  # noqa: E402
from neuroshard.core.intervals import paired_interval  # noqa: E402
from neuroshard.data.dataset import process_raw  # noqa: E402
from neuroshard.data.synthetic import synthesize_tables  # noqa: E402
from neuroshard.hardware.backends import resolve_hardware  # noqa: E402
from neuroshard.hardware.compute_bench import ComputeBenchmark  # noqa: E402

PAIRS = {"pooling": (([0], [64]), ([12], [64])),
         "dim": (([12], [4]), ([12], [128])),
         "tables": (([0], [32]), (list(range(12)), [32] * 12))}


@dataclass
class ComputeCostScalingConfig:
    """How the measured compute cost grows with pooling, dim and tables (benchmarks/compute_cost_scaling.py)."""

    reps: int = flag(15, "interleaved measurements of each shard of a pair")
    batch_size: int = flag(2048)
    backend: str = flag("auto", "auto, fbgemm or torch")
    out_csv: str = flag("results/bench_compute_cost_scaling.csv")

    def check(self) -> "ComputeCostScalingConfig":
        check_int("--reps", self.reps, 2, 10_000)
        check_int("--batch_size", self.batch_size, 1, 1 << 20)
        return self


def main(argv=None) -> None:
    C = ComputeCostScalingConfig
    args = config_from_args(C, step_parser(C, __doc__, raw_doc=True).parse_args(argv)).check()
    torch.set_num_threads(1)
    hw = resolve_hardware("cpu", args.backend)
    raw = synthesize_tables([20000] * 13, [2] * 12 + [60], [[0.0]] * 13, args.batch_size, progress=False)
    rows = []
    with tempfile.TemporaryDirectory(prefix="neuroshard-bench-") as tmp:
        bench = ComputeBenchmark(process_raw(*raw, out_dir=tmp, source={"source": "benchmark"}, progress=False),
                                 hw, args.batch_size, warmup_iter=2, num_iter=7)
        for name, (a, b) in tqdm(PAIRS.items(), desc="pairs"):
            ms_a, ms_b = [], []
            for _ in range(args.reps):
                ms_a.append(bench.measure(*a))
                ms_b.append(bench.measure(*b))
            iv = paired_interval(ms_b, ms_a)
            rows.append({"pair": name, "ratio": iv.estimate, "ci_lo": iv.lo, "ci_hi": iv.hi, "reps": iv.n})
    df = pd.DataFrame(rows)
    print(df.to_string(index=False, float_format="%.3f"))
    write_results(args.out_csv, df, **asdict(args))


if __name__ == "__main__":
    run_main(main)
