"""Throughput of the two cost-data collectors (samples per minute). Run by hand:
python benchmarks/collection_throughput.py [--data_dir data/dlrm_datasets] [--workers 2] [--ndevices 4]

Writes into a temporary folder (the project's data/cost_data is not touched) and a CSV of the rates.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from neuroshard.core.artifacts import write_results  # noqa: E402
from neuroshard.core.cli import config_from_args, run_main, step_parser  # noqa: E402
from neuroshard.core.config import PRESETS, flag  # noqa: E402
from neuroshard.core.errors import check_int  # noqa: E402
from neuroshard.core.file_names import DATASET_DIR  # noqa: E402
from neuroshard.core.costs import check_max_mem_gb  # noqa: E402


def rate(cmd: list[str]) -> float:
    out = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        raise SystemExit(out.stderr)
    return float(re.search(r"\(([\d.]+) samples/min\)", out.stdout).group(1))


@dataclass
class CollectionThroughputConfig:
    """Throughput of the two cost-data collectors (benchmarks/collection_throughput.py)."""

    data_dir: str = flag(DATASET_DIR)
    workers: int = flag(2, "compute-collector workers")
    ndevices: int = flag(4, "comm-collector ranks")
    max_mem: float = flag(PRESETS["quick"].max_mem, "GB per shard (the quick preset's)")
    compute_samples: int = flag(200)
    comm_samples: int = flag(50)
    out_csv: str = flag("results/bench_collection.csv")

    def check(self) -> "CollectionThroughputConfig":
        check_int("--workers", self.workers, 1, 1024)
        check_int("--ndevices", self.ndevices, 2, 1024)
        check_max_mem_gb(self.max_mem)
        check_int("--compute_samples", self.compute_samples, 1, 10_000_000)
        check_int("--comm_samples", self.comm_samples, 1, 10_000_000)
        return self


def main(argv=None) -> None:
    C = CollectionThroughputConfig
    args = config_from_args(C, step_parser(C, __doc__, raw_doc=True).parse_args(argv)).check()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        r = rate(["collect_compute_cost_data.py", "--dataset_dir", args.data_dir, "--out_dir", tmp,
                  "--data_size", str(args.compute_samples), "--max_mem", str(args.max_mem), "--workers", str(args.workers)])
        rows.append({"collector": "compute", "setting": f"{args.workers} workers", "samples_per_min": r})
        r = rate(["collect_comm_cost_data.py", "--out_dir", tmp, "--ndevices", str(args.ndevices),
                  "--data_size", str(args.comm_samples)])
        rows.append({"collector": "comm", "setting": f"{args.ndevices} ranks", "samples_per_min": r})
    df = pd.DataFrame(rows)
    print(df.to_string(index=False))
    write_results(args.out_csv, df, **asdict(args))


if __name__ == "__main__":
    run_main(main)
