"""Throughput of the two cost-data collectors (samples per minute). Run by hand:
python benchmarks/collection_throughput.py [--data_dir data/dlrm_datasets] [--workers 2] [--ndevices 4]

Writes into a temporary folder (the project's data/cost_data is not touched) and a CSV of the rates.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from neuroshard.core.artifacts import write_results  # noqa: E402


def rate(cmd: list[str]) -> float:
    out = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        raise SystemExit(out.stderr)
    return float(re.search(r"\(([\d.]+) samples/min\)", out.stdout).group(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data_dir", default="data/dlrm_datasets")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--ndevices", type=int, default=4)
    p.add_argument("--max_mem", type=float, default=0.04)
    p.add_argument("--compute_samples", type=int, default=200)
    p.add_argument("--comm_samples", type=int, default=50)
    p.add_argument("--out_csv", default="results/bench_collection.csv")
    args = p.parse_args()
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
    write_results(args.out_csv, df, **vars(args))


if __name__ == "__main__":
    main()
