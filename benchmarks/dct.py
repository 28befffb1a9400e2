"""DCT benchmark (by hand, not in CI): none / dp / mp / both on MovieLens-100K (and optionally the
synthetic teacher data), several seeds of the uncompressed run for its seed-to-seed spread.

python benchmarks/dct.py [--ndevices 4] [--steps 1000] [--seeds 3] [--dataset movielens]

Writes results/dct_<dataset>.csv (one row per run), results/dct_<dataset>.md (the table) and
results/dct_<dataset>.png (loss curves and bytes per step).
"""
from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from neuroshard.core.artifacts import atomic_write_bytes, atomic_write_text  # noqa: E402
from neuroshard.training.train import TrainConfig, train_dlrm  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dataset", default="movielens")
    p.add_argument("--ndevices", type=int, default=4)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch_size", type=int, default=512)
    p.add_argument("--seeds", type=int, default=3, help="seeds of every mode (spread of the runs)")
    p.add_argument("--out_dir", default="results")
    p.add_argument("--report_only", action="store_true", help="rebuild the table and plot from the CSV")
    a = p.parse_args()
    out = Path(a.out_dir)
    csv = out / f"dct_{a.dataset}.csv"
    if a.report_only:
        return report(pd.read_csv(csv), out, a)
    csv.unlink(missing_ok=True)
    runs = []
    for seed in range(a.seeds):
        for dct in ("none", "dp", "mp", "both"):
            r = train_dlrm(TrainConfig(dataset=a.dataset, ndevices=a.ndevices, steps=a.steps, batch_size=a.batch_size,
                                       dct=dct, seed=seed), csv)
            print(f"seed {seed} {dct:<5} AUC {r['test_auc']:.4f}  step {r['step_ms']:.2f} ms  "
                  f"MP {r['mp_bytes_per_step']:,.0f} B  DP {r['dp_bytes_per_step']:,.0f} B", flush=True)
            runs.append(r)
    report(pd.DataFrame([{k: v for k, v in r.items() if not k.startswith("_")} for r in runs]), out, a)


def markdown(df: pd.DataFrame) -> list[str]:
    cols = list(df.columns)
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] + [
        "| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)]


def report(df: pd.DataFrame, out: Path, a) -> None:
    base = df[df.dct == "none"]
    rows = []
    for dct, g in df.groupby("dct", sort=False):
        rows.append({
            "dct": dct, "runs": len(g),
            "test AUC (mean ± sd)": f"{g.test_auc.mean():.4f} ± {g.test_auc.std(ddof=1) if len(g) > 1 else 0:.4f}",
            "ΔAUC vs none": f"{g.test_auc.mean() - base.test_auc.mean():+.4f}",
            "log loss": f"{g.test_logloss.mean():.4f}",
            "MP bytes/step": f"{g.mp_bytes_per_step.mean():,.0f}",
            "MP reduction": f"{base.mp_bytes_per_step.mean() / g.mp_bytes_per_step.mean():.1f}x",
            "DP bytes/step": f"{g.dp_bytes_per_step.mean():,.0f}",
            "DP reduction": f"{base.dp_bytes_per_step.mean() / g.dp_bytes_per_step.mean():.1f}x",
            "step (ms)": f"{g.step_ms.median():.2f}", "compute": f"{g.compute_ms.median():.2f}",
            "MP comm": f"{g.mp_comm_ms.median():.2f}", "DP comm": f"{g.dp_comm_ms.median():.2f}"})
    table = pd.DataFrame(rows)
    r0 = df.iloc[0]
    md = [f"# DCT on {r0.dataset}: {r0.ndevices} gloo ranks, {r0.steps} steps, batch {r0.batch_size}, "
          f"{df.seed.nunique()} seeds", "",
          "Bytes are those handed to the collectives per step, summed over ranks; times are medians per step "
          "(ms, averaged over ranks, first 10% of steps skipped), median over seeds.", "", *markdown(table), ""]
    atomic_write_text(out / f"dct_{r0.dataset}.md", "\n".join(md))
    atomic_write_bytes(out / f"dct_{r0.dataset}.png", plot(df))
    print("\n".join(md))


def plot(df: pd.DataFrame) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for dct, g in df[df.seed == df.seed.min()].groupby("dct", sort=False):
        curve = json.loads(g.loss_curve.iloc[0])
        steps = sorted(int(s) for s in curve)
        ax1.plot(steps, [curve[str(s)] for s in steps], label=dct)
    ax1.set_xlabel("step")
    ax1.set_ylabel("training loss (BCE)")
    ax1.legend()
    ax1.set_title("loss curves (seed 0)")
    means = df.groupby("dct", sort=False)[["mp_bytes_per_step", "dp_bytes_per_step"]].mean()
    x = np.arange(len(means))
    ax2.bar(x - 0.2, means.mp_bytes_per_step, 0.4, label="MP (all-to-all)")
    ax2.bar(x + 0.2, means.dp_bytes_per_step, 0.4, label="DP (gradients)")
    ax2.set_xticks(x, means.index)
    ax2.set_yscale("log")
    ax2.set_ylabel("bytes per step (log)")
    ax2.legend()
    ax2.set_title("communication")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


if __name__ == "__main__":
    main()
