"""DCT quality and bytes benchmark (by hand, not in CI): none / dp / mp / both, paired by seed.

python benchmarks/dct.py [--dataset movielens] [--arch tiny] [--ndevices 4] [--steps 1000] [--seeds 5]
                         [--dp_keep 0.005] [--mp_keep 0.05] [--eval_every 0] [--dense_opt sgd] [--lr L]
                         [--mp_scope sign2[,sign,table,rank]] [--dp_adam_freeze_after 0[,N]]

For each seed every mode starts from the same initial weights and sees the same batches (both come
from the seed), so each DCT mode is compared with `none` of its own seed: the table gives the mean
paired ΔAUC and Δlog loss with 95% Student-t intervals over the seeds, bytes per step and their
reduction, and step times. One group of ranks per seed runs
its modes (start-up paid once). Seeds already in the CSV are kept (an interrupted benchmark resumes);
--fresh starts over. Writes results/dct_<dataset>_<arch>.csv (one row per run; keep fractions other
than the defaults add _dp<K>/_mp<K> to the name), .md (the table) and .png (loss curves of the first
seed and bytes per step).

--mp_scope and --dp_adam_freeze_after take comma-separated lists: each `mp`/`both` run is made once
per scope, each `dp`/`both` run once per freeze value (0: plain DCT-DP), all in the seed's group and
paired with the seed's one `none`; the table labels them e.g. `mp (rank)`, `dp (freeze 50)` when a
list has more than one value. Values other than the defaults add _scope<S>/_freeze<N> to the name.

With --eval_every N every run holds out the last tenth of its training split for validation and scores
validation and test every N steps; the table then also pairs the test AUC at each run's best validation
step (early stopping), the CSV name gets _eval<N>, and the plot shows the test AUC curves.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from neuroshard.core.artifacts import atomic_write_bytes, atomic_write_text  # noqa: E402
from neuroshard.core.cli import config_from_args, run_main, step_parser  # noqa: E402
from neuroshard.core.config import flag  # noqa: E402
from neuroshard.core.errors import UserError, check_int  # noqa: E402
from neuroshard.core.tables import format_table  # noqa: E402
from neuroshard.training.dct_results import mean_ci, read_results, runs_done, step_part_cells  # noqa: E402
from neuroshard.training.data import load_data  # noqa: E402
from neuroshard.training.train import DCT_MODES, TrainConfig, append_result, train_runs  # noqa: E402


@dataclass
class DctBenchConfig:
    """DCT's accuracy cost per mode (benchmarks/dct.py)."""

    dataset: str = flag("movielens")
    arch: str = flag("tiny")
    ndevices: int = flag(4)
    steps: int = flag(1000)
    batch_size: int = flag(512)
    seeds: int = flag(5, "seeds; every mode runs with each")
    first_seed: int = flag(0, "seeds run are first_seed .. first_seed + seeds - 1")
    modes: str = flag(",".join(DCT_MODES), "comma-separated; none is always run")
    dp_keep: float = flag(TrainConfig.dp_keep, "DCT-DP's share of gradient entries sent")
    mp_keep: float = flag(TrainConfig.mp_keep, "DCT-MP's share of pooled entries sent")
    mp_scope: str = flag(TrainConfig.mp_scope, "what DCT-MP sends: sign2 (2 bits forward on wide shards), sign, a "
                                               "top-k per table shard (table) or per rank (rank); comma-separated: "
                                               "each")
    dp_adam_freeze_after: str = flag(str(TrainConfig.dp_adam_freeze_after), "with --dense_opt adam: dense DP steps "
                                     "before Adam's second moment is frozen and DCT-DP starts (0: off); "
                                     "comma-separated: each")
    dense_opt: str = flag(TrainConfig.dense_opt, "the MLPs' optimizer: sgd or adam")
    lr: float | None = flag(None, "the MLPs' learning rate (default: sgd 1.0, adam 1e-3)")
    eval_every: int = flag(0, "score validation and test every N steps; also pair the test AUC at the best "
                              "validation step")
    num_samples: int | None = flag(None, "synthetic: samples")
    max_rows: int | None = flag(None, "synthetic: rows of the largest table")
    out_dir: str = flag("results")
    fresh: bool = flag(False, "drop the runs already in the CSV")
    report_only: bool = flag(False, "rebuild the table and plot from the CSV")

    def check(self) -> "DctBenchConfig":
        for scope in _list(self.mp_scope, "--mp_scope"):
            for freeze in _list(self.dp_adam_freeze_after, "--dp_adam_freeze_after", int):
                TrainConfig(dataset=self.dataset, arch=self.arch, ndevices=self.ndevices, steps=self.steps,
                            batch_size=self.batch_size, dp_keep=self.dp_keep, mp_keep=self.mp_keep,
                            num_samples=self.num_samples, max_rows=self.max_rows, eval_every=self.eval_every,
                            dense_opt=self.dense_opt, lr=self.lr, mp_scope=scope,
                            dp_adam_freeze_after=freeze).check()
        check_int("--seeds", self.seeds, 1)
        check_int("--first_seed", self.first_seed, 0)
        if any(m not in DCT_MODES for m in self.modes.split(",")):
            raise UserError(f"--modes must be from {', '.join(DCT_MODES)}, got {self.modes!r}")
        return self


def main(argv=None) -> None:
    run(config_from_args(DctBenchConfig, step_parser(DctBenchConfig, __doc__, raw_doc=True).parse_args(argv)))


def _list(text: str, flag: str, kind=str) -> list:
    try:
        values = [kind(v) for v in str(text).split(",")]
    except ValueError:
        values = []
    if not values or len(set(values)) != len(values):
        raise UserError(f"{flag} must be distinct values separated by commas, got {text!r}")
    return values


def run(a: DctBenchConfig) -> None:
    a.check()
    scopes = _list(a.mp_scope, "--mp_scope")
    freezes = _list(a.dp_adam_freeze_after, "--dp_adam_freeze_after", int)
    out = Path(a.out_dir)
    tag = "".join(f"_{name}{value:g}" for name, value, default in (("dp", a.dp_keep, TrainConfig.dp_keep),
                                                                  ("mp", a.mp_keep, TrainConfig.mp_keep))
                  if value != default)  # other keep fractions get their own CSV
    tag += f"_eval{a.eval_every}" if a.eval_every else ""
    tag += f"_{a.dense_opt}" if a.dense_opt != TrainConfig.dense_opt else ""
    tag += f"_lr{a.lr:g}" if a.lr is not None else ""
    tag += f"_scope{'-'.join(scopes)}" if scopes != [TrainConfig.mp_scope] else ""
    tag += f"_freeze{'-'.join(map(str, freezes))}" if freezes != [TrainConfig.dp_adam_freeze_after] else ""
    csv = out / f"dct_{a.dataset}_{a.arch}{tag}.csv"
    modes = ["none"] + [m for m in a.modes.split(",") if m != "none"]
    if not a.report_only:
        settings = {"dataset": a.dataset, "arch": a.arch, "ndevices": a.ndevices, "steps": a.steps,
                    "batch_size": a.batch_size, **({"eval_every": a.eval_every} if a.eval_every else {}),
                    "dense_opt": a.dense_opt,
                    **({"lr": a.lr} if a.lr is not None else {})}
        keys = ("seed", "dct", "mp_scope", "dp_adam_freeze_after")
        # settings and code checked first (a CSV of older code lacks the scope and freeze columns)
        done = runs_done(csv, a.fresh, settings, ("seed", "dct"))
        if done:
            old = read_results(csv, keys)
            done = set(zip(*(old[k] for k in keys)))
        # every (mode, scope, freeze) run; the scope matters only to mp/both, the freeze only to dp/both
        variants = [(m, s, f) for m in modes for s in (scopes if m in ("mp", "both") else scopes[:1])
                    for f in (freezes if m in ("dp", "both") else freezes[:1])]
        data = None
        for seed in range(a.first_seed, a.first_seed + a.seeds):  # one group of ranks per seed runs its modes
            todo = [v for v in variants if (seed, *v) not in done]
            if not todo:
                continue
            cfgs = [TrainConfig(dataset=a.dataset, arch=a.arch, ndevices=a.ndevices, steps=a.steps,
                                batch_size=a.batch_size, dct=dct, seed=seed, num_samples=a.num_samples,
                                dp_keep=a.dp_keep, mp_keep=a.mp_keep, mp_scope=scope, dp_adam_freeze_after=freeze,
                                max_rows=a.max_rows, log_every=max(1, a.steps // 50), eval_every=a.eval_every,
                                dense_opt=a.dense_opt, lr=a.lr)
                    for dct, scope, freeze in todo]
            if data is None or a.dataset == "synthetic":  # synthetic data depends on the seed
                data = load_data(a.dataset, seed, a.num_samples, a.max_rows)
            for (dct, _, _), r in zip(todo, train_runs(cfgs, data)):
                append_result(csv, {k: v for k, v in r.items() if not k.startswith("_")})
                dct = label(r, len(scopes) > 1, len(freezes) > 1)
                best = f" (at best validation, step {r['best_step']}: {r['test_auc_at_best']:.4f})" if a.eval_every else ""
                print(f"seed {seed} {dct:<5} AUC {r['test_auc']:.4f}{best}  step {r['step_ms']:.2f} ms  "
                      f"MP {r['mp_bytes_per_step']:,.0f} B  DP {r['dp_bytes_per_step']:,.0f} B", flush=True)
    report(read_results(csv, ("seed", "dct", "test_auc", "test_logloss", "loss_curve")), out, csv.stem)


def label(r, scopes: bool, freezes: bool) -> str:
    """A run's name in the table: its mode, plus its scope / freeze where the CSV holds several."""
    extra = ([r["mp_scope"]] if scopes and r["dct"] in ("mp", "both") else []) + \
            ([f"freeze {int(r['dp_adam_freeze_after'])}"] if freezes and r["dct"] in ("dp", "both") else [])
    return r["dct"] + (f" ({', '.join(extra)})" if extra else "")


def report(df: pd.DataFrame, out: Path, stem: str) -> None:
    # rows made before --mp_scope / --dp_adam_freeze_after existed: one top-k per rank, no freeze
    df = df.assign(**{c: df[c] if c in df else v for c, v in (("mp_scope", "rank"), ("dp_adam_freeze_after", 0))})
    many_scopes = df[df.dct.isin(["mp", "both"])].mp_scope.nunique() > 1
    many_freezes = df[df.dct.isin(["dp", "both"])].dp_adam_freeze_after.nunique() > 1
    df = df.assign(dct=[label(r, many_scopes, many_freezes) for _, r in df.iterrows()])
    base = df[df.dct == "none"].set_index("seed")
    rows = []
    for dct, g in df.groupby("dct", sort=False):
        g = g.set_index("seed")
        paired = [s for s in g.index if s in base.index]
        # a run that diverged (NaN predictions: AUC NaN) is counted and named, not averaged in
        seeds = [s for s in paired if np.isfinite(g.test_auc[s]) and np.isfinite(base.test_auc[s])]
        d_auc = mean_ci(g.test_auc[seeds] - base.test_auc[seeds])
        d_ll = mean_ci(g.test_logloss[seeds] - base.test_logloss[seeds])
        fin = g.test_auc[np.isfinite(g.test_auc)]
        rows.append({
            "dct": dct, "seeds": f"{len(seeds)}" + (f" ({len(paired) - len(seeds)} diverged)" if len(paired) > len(seeds) else ""),
            "test AUC (mean ± sd)": f"{fin.mean():.4f} ± {fin.std(ddof=1) if len(fin) > 1 else 0:.4f}",
            "paired ΔAUC [95% CI]": f"{d_auc[0]:+.4f} [{d_auc[1]:+.4f}, {d_auc[2]:+.4f}]",
            "paired Δlog loss [95% CI]": f"{d_ll[0]:+.4f} [{d_ll[1]:+.4f}, {d_ll[2]:+.4f}]",
            **(early_stopping(g, base, seeds) if "test_auc_at_best" in df else {}),
            "MP bytes/step": f"{g.mp_bytes_per_step.mean():,.0f}",
            "MP reduction": f"{base.mp_bytes_per_step.mean() / g.mp_bytes_per_step.mean():.1f}x",
            "DP bytes/step": f"{g.dp_bytes_per_step.mean():,.0f}",
            "DP reduction": f"{base.dp_bytes_per_step.mean() / g.dp_bytes_per_step.mean():.1f}x",
            **step_part_cells(g)})
    r0 = df.iloc[0]
    md = [f"# DCT on {r0.dataset}, arch {r0.arch}: {r0.ndevices} gloo ranks, {r0.steps} steps, batch {r0.batch_size}, "
          f"{df.seed.nunique()} seeds" + (f", MLPs trained with {r0.dense_opt} (lr {r0.lr:g})" if "dense_opt" in df else ""), "",
          "Paired: for each seed every mode starts from the same weights and sees the same batches; Δ = mode − none "
          "of the same seed, mean and 95% Student-t interval over the seeds. Bytes are those that leave each rank "
          "per step (MP: not a rank's own piece), summed over ranks; times are medians per step (ms, averaged over "
          "ranks, first 10% of steps skipped), median over seeds (loopback, unshaped: see benchmarks/dct_network.py for a "
          "bandwidth-limited network).", *([
              "", f"Early stopping (--eval_every {int(r0.eval_every)}): the last tenth of the training split is held out "
              "for validation; every run scores validation and test every "
              f"{int(r0.eval_every)} steps, and the 'at best valid' columns take the test scores at the run's step of "
              "best validation AUC, paired by seed like the others."] if "eval_every" in df else []),
          "", *format_table(list(rows[0]), [list(r.values()) for r in rows]), ""]
    atomic_write_text(out / f"{stem}.md", "\n".join(md))
    atomic_write_bytes(out / f"{stem}.png", plot(df))
    print("\n".join(md))


def early_stopping(g: pd.DataFrame, base: pd.DataFrame, seeds) -> dict:
    """Columns for the test scores at each run's best validation step, paired by seed."""
    d_auc = mean_ci(g.test_auc_at_best[seeds] - base.test_auc_at_best[seeds])
    d_ll = mean_ci(g.test_logloss_at_best[seeds] - base.test_logloss_at_best[seeds])
    return {"best-valid step (median)": f"{g.best_step.median():.0f}",
            "test AUC at best valid": f"{g.test_auc_at_best.mean():.4f} ± "
                                      f"{g.test_auc_at_best.std(ddof=1) if len(g) > 1 else 0:.4f}",
            "paired ΔAUC at best valid [95% CI]": f"{d_auc[0]:+.4f} [{d_auc[1]:+.4f}, {d_auc[2]:+.4f}]",
            "paired Δlog loss at best valid [95% CI]": f"{d_ll[0]:+.4f} [{d_ll[1]:+.4f}, {d_ll[2]:+.4f}]"}


def plot(df: pd.DataFrame) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evals = "eval_curve" in df
    fig, axes = plt.subplots(1, 3 if evals else 2, figsize=(16 if evals else 11, 4))
    ax1, ax2 = axes[0], axes[1]
    for dct, g in df[df.seed == df.seed.min()].groupby("dct", sort=False):
        curve = json.loads(g.loss_curve.iloc[0])
        steps = sorted(int(s) for s in curve)
        ax1.plot(steps, [curve[str(s)] for s in steps], label=dct)
    ax1.set_xlabel("step")
    ax1.set_ylabel("training loss (BCE)")
    ax1.legend()
    ax1.set_title(f"loss curves (seed {df.seed.min()})")
    means = df.groupby("dct", sort=False)[["mp_bytes_per_step", "dp_bytes_per_step"]].mean()
    x = np.arange(len(means))
    ax2.bar(x - 0.2, means.mp_bytes_per_step, 0.4, label="MP (all-to-all)")
    ax2.bar(x + 0.2, means.dp_bytes_per_step, 0.4, label="DP (gradients)")
    ax2.set_xticks(x, means.index)
    ax2.set_yscale("log")
    ax2.set_ylabel("bytes per step (log)")
    ax2.legend()
    ax2.set_title("communication")
    if evals:
        for dct, g in df[df.seed == df.seed.min()].groupby("dct", sort=False):
            curve = json.loads(g.eval_curve.iloc[0])
            steps = sorted(int(s) for s in curve)
            axes[2].plot(steps, [curve[str(s)][1] for s in steps], label=dct)
        axes[2].set_xlabel("step")
        axes[2].set_ylabel("test AUC")
        axes[2].legend()
        axes[2].set_title(f"test AUC during training (seed {df.seed.min()})")
    fig.tight_layout()
    from neuroshard.experiments.summary_report import figure_png

    return figure_png(fig)


if __name__ == "__main__":
    run_main(main)
