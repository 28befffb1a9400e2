"""DCT on a bandwidth-limited network (by hand, not in CI; needs root): time per step of
none / dp / mp / both at several link bandwidths.

sudo python benchmarks/dct_network.py [--arch mlperf] [--ndevices 4] [--bandwidths 1,2.5,10,0] [--reps 2] [--dense_opt sgd]

The script re-runs itself inside a private network namespace of its own (`unshare -n`,
neuroshard/hardware/netns.py): there it brings the namespace's loopback up and shapes it with a token bucket
(`tc qdisc replace dev lo root tbf rate R burst 256kb latency 50ms`; 0 = unshaped), and the ranks
talk over that loopback only. Nothing outside the namespace is touched: the shaping dies with it.
Every rank shares the one shaped loopback, so R is the aggregate bandwidth of the whole group (like
one shared link), not per rank. Runs are interleaved (every rep visits every bandwidth and mode, the
order rotated each rep), so machine load drifts hit every mode alike; one group of ranks per rep
runs them all, so process start-up is paid once. Per run: median step time and
its split into compute / DP codec / MP codec / MP comm / DP comm: DP codec is the DCT-DP compression work on
the training thread (thresholding, tau refreshes, encoding; decoding too with --dp_sync on); MP codec is
DCT-MP's coding around its all-to-alls (encoding, decoding); MP comm is the time inside the all-to-alls; DP comm is the time the step waited for DP
communication after autograd's last gradient (with asynchronous hooks, the default, what did not
overlap backward; with --dp_sync on, the time inside the blocking collectives); compute is the rest. Speedup of a mode = step time of `none` / step time of the mode in the
same rep and bandwidth; the table gives their geometric mean and 95% Student-t interval over reps.
The bandwidth where DCT stops paying: from a fit step = a + s / R per mode over the shaped
bandwidths, the R where `none` and `both` cross. Runs already in the CSV are kept (Ctrl-C loses no
finished rep; rerun to go on); --fresh starts over. Writes results/dct_network.{csv,md} and
docs/dct_network.png.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from neuroshard.core.artifacts import atomic_write_bytes, atomic_write_text  # noqa: E402
from neuroshard.core.cli import config_from_args, run_main, step_parser  # noqa: E402
from neuroshard.core.config import flag  # noqa: E402
from neuroshard.core.errors import UserError, check_int  # noqa: E402
from neuroshard.core.tables import format_table  # noqa: E402
from neuroshard.hardware import netns  # noqa: E402
from neuroshard.training.dct_results import ratio_ci, read_results, runs_done, step_part_cells, step_parts  # noqa: E402
from neuroshard.training.train import DCT_MODES, TrainConfig, append_result, train_runs  # noqa: E402

SCRIPT = "benchmarks/dct_network.py"


def shape_run(gbits: list[float], i: int) -> None:
    """Called on rank 0 before run i: shape the namespace's loopback for it."""
    netns.shape(gbits[i])


@dataclass
class DctNetworkConfig:
    """DCT's step time on shaped bandwidths (benchmarks/dct_network.py)."""

    arch: str = flag("mlperf")
    dataset: str = flag("movielens")
    ndevices: int = flag(4)
    steps: int = flag(15, "steps per run (the first 10%% are not timed)")
    batch_size: int = flag(512)
    bandwidths: str = flag("1,2.5,10,0", "Gbit/s, comma-separated; 0 = unshaped loopback")
    modes: str = flag(",".join(DCT_MODES))
    reps: int = flag(2)
    dense_opt: str = flag(TrainConfig.dense_opt, "the MLPs' optimizer: sgd or adam")
    dp_sync: bool = flag(False, "on: blocking DP hooks (the reference), off: asynchronous (default)", parse="on_off")
    out_dir: str = flag("results")
    plot: str = flag("docs/dct_network.png")
    fresh: bool = flag(False, "drop the runs already in the CSV")
    report_only: bool = flag(False, "rebuild the table and plot from the CSV")

    def gbits(self) -> list[float]:
        try:
            return [float(x) for x in self.bandwidths.split(",")]
        except ValueError:
            raise UserError(f"--bandwidths must be numbers in Gbit/s joined by commas, got {self.bandwidths!r}") \
                from None

    def check(self) -> "DctNetworkConfig":
        bws, modes = self.gbits(), self.modes.split(",")
        if not bws or not all(0 <= b <= 1000 for b in bws):  # also refuses nan and inf
            raise UserError(f"--bandwidths must be Gbit/s from 0 (unshaped) to 1000, got {self.bandwidths!r}")
        if "none" not in modes or any(m not in DCT_MODES for m in modes):
            raise UserError(f"--modes must be from {', '.join(DCT_MODES)} and include none, got {self.modes!r}")
        check_int("--reps", self.reps, 1)
        TrainConfig(dense_opt=self.dense_opt).check()
        return self


def main(argv=None) -> None:
    C = DctNetworkConfig
    a = config_from_args(C, step_parser(C, __doc__, raw_doc=True).parse_args(argv)).check()
    bws, modes, dp_sync = a.gbits(), a.modes.split(","), a.dp_sync
    csv = Path(a.out_dir) / "dct_network.csv"
    if a.report_only:
        return report(read_results(csv, ("rep", "gbit", "dct", "step_ms")), csv, Path(a.plot))
    if not netns.inside():
        sys.exit(netns.run_in_namespace(SCRIPT))
    netns.setup_loopback()
    from neuroshard.training.data import load_data

    done = runs_done(csv, a.fresh, {"dataset": a.dataset, "arch": a.arch, "ndevices": a.ndevices, "steps": a.steps,
                                    "batch_size": a.batch_size, "dense_opt": a.dense_opt, "dp_sync": dp_sync},
                     ("rep", "gbit", "dct"))
    data = load_data(a.dataset)
    for rep in range(a.reps):  # one group of ranks per rep runs every (bandwidth, mode), shaping between runs
        todo = [(bws[(i + rep) % len(bws)], modes[(j + rep) % len(modes)])
                for i in range(len(bws)) for j in range(len(modes))]
        todo = [(g, m) for g, m in todo if (rep, g, m) not in done]
        if not todo:
            continue
        cfgs = [TrainConfig(dataset=a.dataset, arch=a.arch, ndevices=a.ndevices, steps=a.steps, dct=m, seed=0,
                            batch_size=a.batch_size, log_every=a.steps, evaluate=False, dense_opt=a.dense_opt,
                            dp_sync=dp_sync)
                for _, m in todo]
        results = train_runs(cfgs, data, partial(shape_run, [g for g, _ in todo]))
        for (gbit, dct), r in zip(todo, results):
            append_result(csv, {"rep": rep, "gbit": gbit, **{k: v for k, v in r.items() if not k.startswith("_")}})
            print(f"rep {rep} {gbit:g} Gbit/s {dct:<5} {step_parts(r)}", flush=True)
    netns.shape(0)
    report(pd.read_csv(csv), csv, Path(a.plot))


def crossover(df: pd.DataFrame) -> float:
    """Gbit/s where the fits step = a + s / R of none and both meet (nan if they do not, for R > 0)."""
    fits = {}
    for dct in ("none", "both"):
        g = df[(df.dct == dct) & (df.gbit > 0)]
        if g.gbit.nunique() < 2:
            return float("nan")
        s, a = np.polyfit(1.0 / g.gbit, g.step_ms, 1)
        fits[dct] = (a, s)
    (a0, s0), (a1, s1) = fits["none"], fits["both"]
    return float((s0 - s1) / (a1 - a0)) if a1 > a0 and s0 > s1 else float("inf")


def report(df: pd.DataFrame, csv: Path, plot_path: Path) -> None:
    rows, speed = [], {}
    for (gbit, dct), g in df.groupby(["gbit", "dct"], sort=True):
        base = df[(df.gbit == gbit) & (df.dct == "none")].set_index("rep").step_ms
        mine = g.set_index("rep").step_ms
        reps = [r for r in mine.index if r in base.index]
        sp = ratio_ci(base[reps] / mine[reps])
        speed[gbit, dct] = sp
        rows.append({"link": f"{gbit:g} Gbit/s" if gbit > 0 else "unshaped", "dct": dct, "reps": len(reps),
                     **step_part_cells(g),
                     "MP MB/step": f"{g.mp_bytes_per_step.mean() / 1e6:.2f}",
                     "DP MB/step": f"{g.dp_bytes_per_step.mean() / 1e6:.3f}",
                     "speedup vs none [95% CI]": f"{sp[0]:.2f}x [{sp[1]:.2f}, {sp[2]:.2f}]"})
    order = {b: i for i, b in enumerate(sorted(df.gbit.unique(), key=lambda b: b if b > 0 else np.inf))}
    rows.sort(key=lambda r: (order[float(r["link"].split()[0]) if r["link"] != "unshaped" else 0.0],
                             DCT_MODES.index(r["dct"])))
    x = crossover(df)
    r0 = df.iloc[0]
    md = [f"# DCT on a shaped loopback: {r0.dataset}, arch {r0.arch}, {r0.ndevices} gloo ranks, batch {r0.batch_size}, "
          f"{r0.steps} steps per run, {df.rep.nunique()} interleaved reps", "",
          "Each rate is the aggregate bandwidth of the namespace's one loopback (tc tbf), shared by all ranks. "
          "Times are medians per step in ms (averaged over ranks); speedup = none / mode in the same rep, geometric "
          "mean and 95% Student-t interval over reps. DP codec: DCT-DP's compression work on the training thread; "
          "MP codec: DCT-MP's coding around its all-to-alls; "
          "DP comm: the wait for DP communication after backward's last gradient (asynchronous hooks unless "
          "--dp_sync on); compute: the rest.", "", *format_table(list(rows[0]), [list(r.values()) for r in rows]), "",
          f"Where DCT stops paying (fit step = a + s/R of none and both over the shaped rates): "
          f"{x:.1f} Gbit/s." if np.isfinite(x) else "Where DCT stops paying: the fits do not cross above 0 Gbit/s "
          "(both is faster at every rate, or slower at every rate; see the table).", ""]
    atomic_write_text(csv.with_suffix(".md"), "\n".join(md))
    atomic_write_bytes(plot_path, plot(speed, order))
    print("\n".join(md))


def plot(speed: dict, order: dict) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    bws = sorted(order, key=order.get)
    labels = [f"{b:g}" if b > 0 else "unshaped" for b in bws]
    for dct in DCT_MODES[1:]:
        pts = [(order[b], speed[b, dct]) for b in bws if (b, dct) in speed]
        if not pts:
            continue
        xs = [p[0] for p in pts]
        mid = np.array([p[1][0] for p in pts])
        err = np.array([[p[1][0] - p[1][1], p[1][2] - p[1][0]] for p in pts]).T
        ax.errorbar(xs, mid, yerr=err, marker="o", capsize=3, label=f"--dct {dct}")
    ax.axhline(1.0, color="grey", lw=1, ls="--")
    ax.set_xticks(range(len(bws)), labels)
    ax.set_xlabel("loopback bandwidth (Gbit/s, tc tbf)")
    ax.set_ylabel("speedup per step vs --dct none")
    ax.set_title("DCT on a bandwidth-limited network (95% CI over reps)")
    ax.legend()
    fig.tight_layout()
    from neuroshard.experiments.summary_report import figure_png

    return figure_png(fig)


if __name__ == "__main__":
    run_main(main)
