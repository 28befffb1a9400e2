"""How much of the DLRM's dot interaction survives DCT-MP, at the initial weights (by hand, not in CI).

python benchmarks/mp_interaction.py [--datasets movielens,synthetic] [--archs tiny,mlperf] [--seeds 3]
                                    [--mp_keep 0.05] [--ndevices 4] [--num_samples 4096]

For each dataset, arch and seed: the plan, embeddings and bottom MLP `tools/train_dlrm.py` would start
from, the first --num_samples training samples, and the dot products the top MLP sees, with and without
DCT-MP's per-sample top-k (neuroshard/training/interaction.py). Prints one row per dataset and arch
(means over the seeds) and writes results/mp_interaction.{md,json}. Synthetic data uses 40,000 samples
and 20,000 rows at most per table, as the DCT quality benchmark does.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from neuroshard.core.artifacts import write_results  # noqa: E402
from neuroshard.core.cli import run_main  # noqa: E402
from neuroshard.core.errors import UserError, check_int  # noqa: E402
from neuroshard.training.data import load_data  # noqa: E402
from neuroshard.training.interaction import mp_interaction_fidelity  # noqa: E402
from neuroshard.training.report import markdown  # noqa: E402
from neuroshard.training.train import ARCHS, TrainConfig  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", default="movielens,synthetic")
    p.add_argument("--archs", default="tiny,mlperf")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--mp_keep", type=float, default=TrainConfig.mp_keep)
    p.add_argument("--ndevices", type=int, default=4)
    p.add_argument("--num_samples", type=int, default=4096)
    p.add_argument("--out_dir", default="results")
    a = p.parse_args(argv)
    datasets, archs = a.datasets.split(","), a.archs.split(",")
    for arch in archs:
        if arch not in ARCHS:
            raise UserError(f"--archs must be from {', '.join(ARCHS)}, got {arch!r}")
    for name in datasets:
        TrainConfig(dataset=name, ndevices=a.ndevices, mp_keep=a.mp_keep).check()
    check_int("--seeds", a.seeds, 1, 1000)
    check_int("--num_samples", a.num_samples, a.ndevices, 100_000)
    runs, rows = [], []
    with tqdm(total=len(datasets) * len(archs) * a.seeds, desc="interaction under DCT-MP") as bar:
        for name in datasets:
            for seed in range(a.seeds):
                data = load_data(name, seed, 40_000, 20_000)
                for arch in archs:
                    cfg = TrainConfig(dataset=name, arch=arch, ndevices=a.ndevices, mp_keep=a.mp_keep, seed=seed)
                    runs.append({"dataset": name, "arch": arch, "seed": seed,
                                 **mp_interaction_fidelity(data, cfg, a.num_samples)})
                    bar.update()
    for name in datasets:
        for arch in archs:
            rs = [r for r in runs if (r["dataset"], r["arch"]) == (name, arch)]
            mean = lambda kind, key: float(np.mean([r[kind][key] for r in rs]))  # noqa: E731
            rows.append({"dataset": name, "arch": arch, "seeds": len(rs),
                         "columns a rank holds": "/".join(map(str, rs[0]["widths"])),
                         "kept a sample": "/".join(map(str, rs[0]["kept_per_sample"])),
                         **{f"{label}: {col}": f"{mean(kind, key):.3f}"
                            for kind, label in (("table_table", "table·table"), ("z_table", "z·table"))
                            for key, col in (("zero_share", "zero"), ("median_corr", "corr"), ("rel_error", "rel. error"))}})
    md = [f"# The dot interaction under DCT-MP (mp_keep {a.mp_keep:g}, {a.ndevices} ranks, initial weights, "
          f"{a.num_samples} samples)", "",
          "zero: share of dot products that are exactly 0 under DCT-MP; corr: median over pairs of the Pearson "
          "correlation, across samples, of the dot product with and without DCT-MP; rel. error: "
          "||compressed - uncompressed|| / ||uncompressed|| over all of them. Means over seeds.", "", *markdown(rows), ""]
    write_results(a.out_dir, "mp_interaction", "\n".join(md), {"runs": runs})
    print("\n".join(md))


if __name__ == "__main__":
    run_main(main)
